// Original file: proto/engine.proto


export interface TokenLogprobs {
  'logprob'?: (number | string);
  'topTokenIds'?: (number)[];
  'topLogprobs'?: (number | string)[];
  'rank'?: (number);
}

export interface TokenLogprobs__Output {
  'logprob': (number);
  'topTokenIds': (number)[];
  'topLogprobs': (number)[];
  'rank': (number);
}

// Original file: proto/engine.proto


export interface TokenLogprobs {
  'logprob'?: (number | string);
  'topTokenIds'?: (number)[];
  'topLogprobs'?: (number | string)[];
}

export interface TokenLogprobs__Output {
  'logprob': (number);
  'topTokenIds': (number)[];
  'topLogprobs': (number)[];
}

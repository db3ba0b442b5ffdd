// Original file: proto/engine.proto

import type { Long } from '@grpc/proto-loader';

export interface SamplingParams {
  'temperature'?: (number | string);
  'topP'?: (number | string);
  'topK'?: (number);
  'seed'?: (number | string | Long);
  'maxTokens'?: (number);
  'stopTokenIds'?: (number)[];
  'ignoreEos'?: (boolean);
  'minP'?: (number | string);
  'presencePenalty'?: (number | string);
  'frequencyPenalty'?: (number | string);
  'repetitionPenalty'?: (number | string);
  'logitBias'?: ({[key: number]: number | string});
  'minTokens'?: (number);
  'numTopLogprobs'?: (number);
  'numPromptLogprobs'?: (number);
  '_temperature'?: "temperature";
  '_topP'?: "topP";
  '_topK'?: "topK";
  '_seed'?: "seed";
  '_maxTokens'?: "maxTokens";
  '_ignoreEos'?: "ignoreEos";
  '_minP'?: "minP";
  '_presencePenalty'?: "presencePenalty";
  '_frequencyPenalty'?: "frequencyPenalty";
  '_repetitionPenalty'?: "repetitionPenalty";
  '_minTokens'?: "minTokens";
  '_numTopLogprobs'?: "numTopLogprobs";
  '_numPromptLogprobs'?: "numPromptLogprobs";
}

export interface SamplingParams__Output {
  'temperature'?: (number);
  'topP'?: (number);
  'topK'?: (number);
  'seed'?: (string);
  'maxTokens'?: (number);
  'stopTokenIds': (number)[];
  'ignoreEos'?: (boolean);
  'minP'?: (number);
  'presencePenalty'?: (number);
  'frequencyPenalty'?: (number);
  'repetitionPenalty'?: (number);
  'logitBias': ({[key: number]: number});
  'minTokens'?: (number);
  'numTopLogprobs'?: (number);
  'numPromptLogprobs'?: (number);
  '_temperature'?: "temperature";
  '_topP'?: "topP";
  '_topK'?: "topK";
  '_seed'?: "seed";
  '_maxTokens'?: "maxTokens";
  '_ignoreEos'?: "ignoreEos";
  '_minP'?: "minP";
  '_presencePenalty'?: "presencePenalty";
  '_frequencyPenalty'?: "frequencyPenalty";
  '_repetitionPenalty'?: "repetitionPenalty";
  '_minTokens'?: "minTokens";
  '_numTopLogprobs'?: "numTopLogprobs";
  '_numPromptLogprobs'?: "numPromptLogprobs";
}

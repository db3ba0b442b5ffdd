// Original file: proto/engine.proto


export interface AbortRequest {
  'requestId'?: (string);
}

export interface AbortRequest__Output {
  'requestId': (string);
}

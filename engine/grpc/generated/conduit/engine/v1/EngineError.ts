// Original file: proto/engine.proto


export interface EngineError {
  'code'?: (string);
  'message'?: (string);
}

export interface EngineError__Output {
  'code': (string);
  'message': (string);
}

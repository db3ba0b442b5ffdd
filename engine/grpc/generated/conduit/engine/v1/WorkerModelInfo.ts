// Original file: proto/engine.proto


export interface WorkerModelInfo {
  'modelName'?: (string);
  'maxModelLen'?: (number);
  'vocabSize'?: (number);
  'blockSizeTokens'?: (number);
  'eosTokenIds'?: (number)[];
  'blockHashScheme'?: (string);
}

export interface WorkerModelInfo__Output {
  'modelName': (string);
  'maxModelLen': (number);
  'vocabSize': (number);
  'blockSizeTokens': (number);
  'eosTokenIds': (number)[];
  'blockHashScheme': (string);
}

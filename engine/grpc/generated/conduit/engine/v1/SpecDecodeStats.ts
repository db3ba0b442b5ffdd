// Original file: proto/engine.proto


export interface SpecDecodeStats {
  'numDrafts'?: (number);
  'numDraftTokens'?: (number);
  'numAcceptedTokens'?: (number);
  'numAcceptedTokensPerPos'?: (number)[];
}

export interface SpecDecodeStats__Output {
  'numDrafts': (number);
  'numDraftTokens': (number);
  'numAcceptedTokens': (number);
  'numAcceptedTokensPerPos': (number)[];
}

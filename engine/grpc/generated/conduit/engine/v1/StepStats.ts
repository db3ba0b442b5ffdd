// Original file: proto/engine.proto


export interface StepStats {
  'numScheduledTokens'?: (number);
  'numScheduledSeqs'?: (number);
  'numPreempted'?: (number);
  'scheduleMs'?: (number | string);
  'forwardMs'?: (number | string);
  'numPrefixQueriedTokens'?: (number);
  'numPrefixHitTokens'?: (number);
  'kvUsage'?: (number | string);
  'residentMemoryBytes'?: (number | string);
}

export interface StepStats__Output {
  'numScheduledTokens': (number);
  'numScheduledSeqs': (number);
  'numPreempted': (number);
  'scheduleMs': (number);
  'forwardMs': (number);
  'numPrefixQueriedTokens': (number);
  'numPrefixHitTokens': (number);
  'kvUsage': (number);
  'residentMemoryBytes': (number);
}

// Original file: proto/engine.proto

import type { SpecDecodeStats as _conduit_engine_v1_SpecDecodeStats, SpecDecodeStats__Output as _conduit_engine_v1_SpecDecodeStats__Output } from '../../../conduit/engine/v1/SpecDecodeStats.ts';

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
  'specDecode'?: (_conduit_engine_v1_SpecDecodeStats | null);
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
  'specDecode': (_conduit_engine_v1_SpecDecodeStats__Output | null);
}

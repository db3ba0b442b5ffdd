// Original file: proto/engine.proto

import type { RequestOutput as _conduit_engine_v1_RequestOutput, RequestOutput__Output as _conduit_engine_v1_RequestOutput__Output } from '../../../conduit/engine/v1/RequestOutput.ts';
import type { KvEvent as _conduit_engine_v1_KvEvent, KvEvent__Output as _conduit_engine_v1_KvEvent__Output } from '../../../conduit/engine/v1/KvEvent.ts';
import type { WorkerLoad as _conduit_engine_v1_WorkerLoad, WorkerLoad__Output as _conduit_engine_v1_WorkerLoad__Output } from '../../../conduit/engine/v1/WorkerLoad.ts';
import type { StepStats as _conduit_engine_v1_StepStats, StepStats__Output as _conduit_engine_v1_StepStats__Output } from '../../../conduit/engine/v1/StepStats.ts';

export interface StepOutput {
  'outputs'?: (_conduit_engine_v1_RequestOutput)[];
  'kvEvents'?: (_conduit_engine_v1_KvEvent)[];
  'load'?: (_conduit_engine_v1_WorkerLoad | null);
  'stats'?: (_conduit_engine_v1_StepStats | null);
}

export interface StepOutput__Output {
  'outputs': (_conduit_engine_v1_RequestOutput__Output)[];
  'kvEvents': (_conduit_engine_v1_KvEvent__Output)[];
  'load': (_conduit_engine_v1_WorkerLoad__Output | null);
  'stats': (_conduit_engine_v1_StepStats__Output | null);
}

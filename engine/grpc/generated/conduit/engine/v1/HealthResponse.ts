// Original file: proto/engine.proto

import type { WorkerModelInfo as _conduit_engine_v1_WorkerModelInfo, WorkerModelInfo__Output as _conduit_engine_v1_WorkerModelInfo__Output } from '../../../conduit/engine/v1/WorkerModelInfo.ts';
import type { WorkerLoad as _conduit_engine_v1_WorkerLoad, WorkerLoad__Output as _conduit_engine_v1_WorkerLoad__Output } from '../../../conduit/engine/v1/WorkerLoad.ts';

export interface HealthResponse {
  'serving'?: (boolean);
  'model'?: (_conduit_engine_v1_WorkerModelInfo | null);
  'load'?: (_conduit_engine_v1_WorkerLoad | null);
}

export interface HealthResponse__Output {
  'serving': (boolean);
  'model': (_conduit_engine_v1_WorkerModelInfo__Output | null);
  'load': (_conduit_engine_v1_WorkerLoad__Output | null);
}

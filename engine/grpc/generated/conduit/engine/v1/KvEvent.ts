// Original file: proto/engine.proto


// Original file: proto/engine.proto

export const _conduit_engine_v1_KvEvent_Kind = {
  KIND_UNSPECIFIED: 'KIND_UNSPECIFIED',
  KIND_STORED: 'KIND_STORED',
  KIND_REMOVED: 'KIND_REMOVED',
  KIND_CLEARED: 'KIND_CLEARED',
} as const;

export type _conduit_engine_v1_KvEvent_Kind =
  | 'KIND_UNSPECIFIED'
  | 0
  | 'KIND_STORED'
  | 1
  | 'KIND_REMOVED'
  | 2
  | 'KIND_CLEARED'
  | 3

export type _conduit_engine_v1_KvEvent_Kind__Output = typeof _conduit_engine_v1_KvEvent_Kind[keyof typeof _conduit_engine_v1_KvEvent_Kind]

export interface KvEvent {
  'kind'?: (_conduit_engine_v1_KvEvent_Kind);
  'blockHashes'?: (string)[];
}

export interface KvEvent__Output {
  'kind': (_conduit_engine_v1_KvEvent_Kind__Output);
  'blockHashes': (string)[];
}

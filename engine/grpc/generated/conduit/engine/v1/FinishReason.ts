// Original file: proto/engine.proto

export const FinishReason = {
  FINISH_REASON_UNSPECIFIED: 'FINISH_REASON_UNSPECIFIED',
  FINISH_REASON_STOP: 'FINISH_REASON_STOP',
  FINISH_REASON_LENGTH: 'FINISH_REASON_LENGTH',
  FINISH_REASON_ABORT: 'FINISH_REASON_ABORT',
  FINISH_REASON_ERROR: 'FINISH_REASON_ERROR',
} as const;

export type FinishReason =
  | 'FINISH_REASON_UNSPECIFIED'
  | 0
  | 'FINISH_REASON_STOP'
  | 1
  | 'FINISH_REASON_LENGTH'
  | 2
  | 'FINISH_REASON_ABORT'
  | 3
  | 'FINISH_REASON_ERROR'
  | 4

export type FinishReason__Output = typeof FinishReason[keyof typeof FinishReason]

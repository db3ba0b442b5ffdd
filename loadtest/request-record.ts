// One request as the client saw it. Times are milliseconds on the monotonic clock
// (performance.now()), relative to the start of the run: one origin for all its load points.

import type { StreamObserver, TokenUsage } from './transport.ts';

export type OutputTokensSource = 'usage' | 'tokenize' | 'chunks';

export interface RequestRecord {
  sessionId: string;
  turnIndex: number;
  /** When an open-loop schedule meant to send it; null in closed loop. */
  scheduledMs: number | null;
  startMs: number;
  endMs: number;
  /** Arrival of each chunk that carried generated text. */
  chunkTimesMs: number[];
  text: string;
  usage: TokenUsage | null;
  numOutputTokens: number | null;
  outputTokensSource: OutputTokensSource | null;
  errorType: string | null;
  errorMessage: string | null;
}

/** A record with nothing received yet: no chunks, no usage, no error. */
export function newRequestRecord(fields: Pick<RequestRecord, 'sessionId' | 'turnIndex' | 'scheduledMs' | 'startMs'> & Partial<RequestRecord>): RequestRecord {
  return {
    endMs: 0,
    chunkTimesMs: [],
    text: '',
    usage: null,
    numOutputTokens: null,
    outputTokensSource: null,
    errorType: null,
    errorMessage: null,
    ...fields,
  };
}

/** Collects a stream's chunks into the record the driver started. */
export class RecordingObserver implements StreamObserver {
  constructor(
    private readonly record: RequestRecord,
    private readonly originMs: number,
  ) {}

  onText(text: string, atMs: number): void {
    this.record.chunkTimesMs.push(atMs - this.originMs);
    this.record.text += text;
  }

  onUsage(usage: TokenUsage): void {
    this.record.usage = usage;
  }
}

export function ttftMs(record: RequestRecord): number | null {
  return record.chunkTimesMs.length === 0 ? null : record.chunkTimesMs[0] - record.startMs;
}

export function e2eMs(record: RequestRecord): number {
  return record.endMs - record.startMs;
}

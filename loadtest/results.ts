// The results file (results.json): the pooled metrics of the run at the top level, each load
// point's metrics in load_points, and one compact line per request.

import type { LoadPointMetrics } from './metrics.ts';
import { e2eMs, type RequestRecord, ttftMs } from './request-record.ts';

export interface RequestSummary {
  load_point: number;
  session: string;
  turn: number;
  start_ms: number;
  ttft_ms: number | null;
  e2e_ms: number;
  input_tokens: number | null;
  output_tokens: number | null;
  cached_tokens: number | null;
  error: string | null;
}

export interface Results extends LoadPointMetrics {
  schema: 'conduit-loadtest/1';
  label: string;
  url: string;
  model: string;
  endpoint: string;
  transport: string;
  workload: string;
  seed: number;
  started_at: string;
  prompt_lengths: string;
  load_points: LoadPointMetrics[];
  requests: RequestSummary[];
}

const round3 = (value: number) => Math.round(value * 1000) / 1000;

export function requestSummaries(recordsByPoint: readonly (readonly RequestRecord[])[]): RequestSummary[] {
  return recordsByPoint.flatMap((records, loadPoint) =>
    records.map((record) => {
      const ttft = ttftMs(record);
      return {
        load_point: loadPoint,
        session: record.sessionId,
        turn: record.turnIndex,
        start_ms: round3(record.startMs),
        ttft_ms: ttft === null ? null : round3(ttft),
        e2e_ms: round3(e2eMs(record)),
        input_tokens: record.usage?.promptTokens ?? null,
        output_tokens: record.numOutputTokens,
        cached_tokens: record.usage?.cachedPromptTokens ?? null,
        error: record.errorType === null ? null : `${record.errorType}: ${record.errorMessage}`,
      };
    }),
  );
}

export function isResults(value: unknown): value is Results {
  return typeof value === 'object' && value !== null && (value as Results).schema === 'conduit-loadtest/1';
}

// Drives prepared sessions against a transport under one load shape and records every
// request. Open loop: sessions arrive on a schedule (Poisson at a rate, or a trace's
// timestamps) whatever the server's pace. Closed loop: a fixed number of clients, each
// sending its next request when the previous one ends. Turns of a session always run in order,
// each resending the conversation so far.

import { performance } from 'node:perf_hooks';
import { type Rng, exponentialGapMs } from './random.ts';
import { RecordingObserver, newRequestRecord, type RequestRecord } from './request-record.ts';
import { type ChatMessage, RequestError, type Transport } from './transport.ts';

export interface PreparedTurn {
  /** Shared system prompt, sent first. */
  prefixText: string | null;
  userText: string;
  maxTokens: number;
  timestampMs: number | null;
  /** Pause after the previous turn's reply ends, before this turn is sent. */
  thinkTimeMs: number;
}

export interface PreparedSession {
  id: string;
  turns: PreparedTurn[];
}

export type LoadShape =
  | { kind: 'rate'; ratePerS: number; rng: Rng }
  | { kind: 'concurrency'; numClients: number }
  | { kind: 'trace' };

export interface DriveOptions {
  transport: Transport;
  sessions: readonly PreparedSession[];
  load: LoadShape;
  timeoutMs: number;
  /** performance.now() at the start of the whole run: record times are relative to it. */
  originMs: number;
  onRequestDone: (record: RequestRecord) => void;
}

export async function drive(options: DriveOptions): Promise<RequestRecord[]> {
  const { originMs } = options;
  // Schedules (Poisson arrivals, trace timestamps) count from the start of this load point.
  const pointStartMs = performance.now() - originMs;
  const records: RequestRecord[] = [];
  const runSession = (session: PreparedSession, scheduledMs: number | null) =>
    runSessionTurns(session, scheduledMs, pointStartMs, options, records);
  const { load, sessions } = options;
  if (load.kind === 'concurrency') {
    let nextSession = 0;
    const client = async (): Promise<void> => {
      while (nextSession < sessions.length) await runSession(sessions[nextSession++], null);
    };
    await Promise.all(Array.from({ length: Math.min(load.numClients, sessions.length) }, client));
    return records;
  }
  const running: Promise<void>[] = [];
  let poissonArrivalMs = 0;
  for (const session of sessions) {
    // A trace's sessions come sorted by their first timestamp.
    const arrivalMs = pointStartMs + (load.kind === 'trace' ? (session.turns[0].timestampMs ?? 0) : poissonArrivalMs);
    await sleepUntil(arrivalMs, originMs);
    running.push(runSession(session, arrivalMs));
    if (load.kind === 'rate') poissonArrivalMs += exponentialGapMs(load.rng, load.ratePerS);
  }
  await Promise.all(running);
  return records;
}

async function runSessionTurns(
  session: PreparedSession,
  scheduledMs: number | null,
  pointStartMs: number,
  options: DriveOptions,
  records: RequestRecord[],
): Promise<void> {
  const { originMs } = options;
  const history: ChatMessage[] = [];
  for (let turnIndex = 0; turnIndex < session.turns.length; turnIndex++) {
    const turn = session.turns[turnIndex];
    if (turnIndex > 0 && turn.thinkTimeMs > 0) await sleep(turn.thinkTimeMs);
    if (turnIndex > 0 && turn.timestampMs !== null) {
      await sleepUntil(pointStartMs + turn.timestampMs, originMs);
    }
    history.push({ role: 'user', content: turn.userText });
    const messages: ChatMessage[] = turn.prefixText === null ? history : [{ role: 'system', content: turn.prefixText }, ...history];
    const record = newRequestRecord({
      sessionId: session.id,
      turnIndex,
      scheduledMs: turnIndex === 0 ? scheduledMs : null,
      startMs: performance.now() - originMs,
    });
    try {
      await options.transport.stream(
        { messages, maxTokens: turn.maxTokens },
        new RecordingObserver(record, originMs),
        options.timeoutMs,
      );
    } catch (err) {
      record.errorType = err instanceof RequestError ? err.type : 'client';
      record.errorMessage = (err as Error).message;
    }
    record.endMs = performance.now() - originMs;
    // The next turn carries whatever the server answered, as a chat client would.
    history.push({ role: 'assistant', content: record.text });
    records.push(record);
    options.onRequestDone(record);
  }
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

/**
 * Resolves at targetMs after originMs on performance.now()'s clock, never before, so a request
 * is never sent ahead of its schedule. A timer can fire early: libuv counts whole milliseconds
 * from a loop time read before the running callbacks, so the remainder is rechecked, and its
 * last millisecond is waited out in event-loop turns.
 */
async function sleepUntil(targetMs: number, originMs: number): Promise<void> {
  for (;;) {
    const waitMs = targetMs - (performance.now() - originMs);
    if (waitMs <= 0) return;
    await (waitMs >= 1 ? sleep(waitMs) : new Promise<void>((resolve) => setImmediate(resolve)));
  }
}

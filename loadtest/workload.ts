// The workload file: JSONL, one request (one conversation turn) per line. Every scenario can be
// written as such a file and read back into the same workload; the format is documented in
// loadtest/README.md.

import { readFile, writeFile } from 'node:fs/promises';

export interface SharedPrefix {
  /** Entries with the same id share the same prefix text, so the server can cache it. */
  id: string;
  tokens: number;
}

export interface WorkloadEntry {
  /** Entries of one session form a conversation, in file order; absent: a session of its own. */
  session?: string;
  /** Earliest send time relative to the start of the run (trace replay). */
  timestamp_ms?: number;
  /** Pause after the session's previous turn ends, before this one is sent: a user reading and typing. */
  think_time_ms?: number;
  /** Length of fresh, unique user text; exclusive with `text`. */
  input_tokens?: number;
  /** Literal user text; exclusive with `input_tokens`. */
  text?: string;
  prefix?: SharedPrefix;
  /** Generated tokens, held exactly with ignore_eos. */
  output_tokens: number;
}

export class WorkloadError extends Error {
  override name = 'WorkloadError';
}

const ENTRY_KEYS = new Set(['session', 'timestamp_ms', 'think_time_ms', 'input_tokens', 'text', 'prefix', 'output_tokens']);

function describe(value: unknown): string {
  return `${JSON.stringify(value)} of type ${value === null ? 'null' : typeof value}`;
}

function isPositiveInteger(value: unknown): value is number {
  return Number.isInteger(value) && (value as number) >= 1;
}

/** Checks one parsed line; throws with the field at fault and the value received. */
export function validateEntry(raw: unknown): WorkloadEntry {
  if (raw === null || typeof raw !== 'object' || Array.isArray(raw)) {
    throw new WorkloadError(`expected a JSON object but received ${describe(raw)}`);
  }
  const entry = raw as Record<string, unknown>;
  for (const key of Object.keys(entry)) {
    if (!ENTRY_KEYS.has(key)) throw new WorkloadError(`unknown field "${key}"`);
  }
  if (!isPositiveInteger(entry.output_tokens)) {
    throw new WorkloadError(`expected a positive integer for output_tokens but received ${describe(entry.output_tokens)}`);
  }
  const hasInputTokens = entry.input_tokens !== undefined;
  const hasText = entry.text !== undefined;
  if (hasInputTokens === hasText) throw new WorkloadError('expected exactly one of input_tokens and text');
  if (hasInputTokens && !isPositiveInteger(entry.input_tokens)) {
    throw new WorkloadError(`expected a positive integer for input_tokens but received ${describe(entry.input_tokens)}`);
  }
  if (hasText && typeof entry.text !== 'string') {
    throw new WorkloadError(`expected a string for text but received ${describe(entry.text)}`);
  }
  if (entry.session !== undefined && typeof entry.session !== 'string') {
    throw new WorkloadError(`expected a string for session but received ${describe(entry.session)}`);
  }
  if (entry.timestamp_ms !== undefined && !(typeof entry.timestamp_ms === 'number' && entry.timestamp_ms >= 0)) {
    throw new WorkloadError(`expected a number >= 0 for timestamp_ms but received ${describe(entry.timestamp_ms)}`);
  }
  if (entry.think_time_ms !== undefined && !(typeof entry.think_time_ms === 'number' && entry.think_time_ms >= 0)) {
    throw new WorkloadError(`expected a number >= 0 for think_time_ms but received ${describe(entry.think_time_ms)}`);
  }
  if (entry.prefix !== undefined) {
    const prefix = entry.prefix as Record<string, unknown> | null;
    if (prefix === null || typeof prefix !== 'object' || typeof prefix.id !== 'string' || !isPositiveInteger(prefix.tokens)) {
      throw new WorkloadError(`expected {"id": string, "tokens": positive integer} for prefix but received ${describe(entry.prefix)}`);
    }
  }
  return entry as unknown as WorkloadEntry;
}

export function parseWorkload(jsonl: string, sourceName: string): WorkloadEntry[] {
  const entries: WorkloadEntry[] = [];
  const prefixTokensById = new Map<string, number>();
  const lines = jsonl.split('\n');
  for (let i = 0; i < lines.length; i++) {
    const line = lines[i].trim();
    if (line === '') continue;
    const where = `${sourceName}:${i + 1}`;
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch (err) {
      throw new WorkloadError(`${where}: not valid JSON (${(err as Error).message})`);
    }
    let entry: WorkloadEntry;
    try {
      entry = validateEntry(raw);
    } catch (err) {
      throw new WorkloadError(`${where}: ${(err as Error).message}`);
    }
    if (entry.prefix) {
      const known = prefixTokensById.get(entry.prefix.id);
      if (known !== undefined && known !== entry.prefix.tokens) {
        throw new WorkloadError(`${where}: prefix "${entry.prefix.id}" has ${entry.prefix.tokens} tokens here but ${known} earlier`);
      }
      prefixTokensById.set(entry.prefix.id, entry.prefix.tokens);
    }
    entries.push(entry);
  }
  if (entries.length === 0) throw new WorkloadError(`${sourceName}: no requests in the workload file`);
  return entries;
}

export async function readWorkloadFile(filePath: string): Promise<WorkloadEntry[]> {
  let text: string;
  try {
    text = await readFile(filePath, 'utf8');
  } catch (err) {
    throw new WorkloadError(`cannot read workload file ${filePath}: ${(err as Error).message}`);
  }
  return parseWorkload(text, filePath);
}

export function formatWorkload(entries: readonly WorkloadEntry[]): string {
  return entries.map((entry) => JSON.stringify(entry)).join('\n') + '\n';
}

export async function writeWorkloadFile(filePath: string, entries: readonly WorkloadEntry[]): Promise<void> {
  await writeFile(filePath, formatWorkload(entries));
}

export interface Session {
  id: string;
  turns: WorkloadEntry[];
}

/** Groups entries into sessions, ordered by first appearance; a turn keeps its file order. */
export function groupSessions(entries: readonly WorkloadEntry[]): Session[] {
  const sessions: Session[] = [];
  const byId = new Map<string, Session>();
  entries.forEach((entry, index) => {
    const id = entry.session ?? `#${index}`;
    let session = byId.get(id);
    if (!session) {
      session = { id, turns: [] };
      byId.set(id, session);
      sessions.push(session);
    }
    session.turns.push(entry);
  });
  return sessions;
}

export function hasTimestamps(entries: readonly WorkloadEntry[]): boolean {
  return entries.every((entry) => entry.timestamp_ms !== undefined);
}

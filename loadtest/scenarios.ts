// Built-in scenarios. Each generates plain workload entries (the JSONL file format), so a
// scenario and its written-out file drive the server identically.

import { type LengthDistribution, drawLength } from './length-distribution.ts';
import { type Rng, shuffleInPlace } from './random.ts';
import type { WorkloadEntry } from './workload.ts';

export type ScenarioSpec =
  | { name: 'fixed'; inputTokens: number; outputTokens: number }
  /** SGLang's generated-shared-prefix shape: groups of requests behind one long system prompt. */
  | { name: 'shared-prefix'; numGroups: number; systemPromptTokens: number; inputTokens: number; outputTokens: number }
  /** Conversations whose every turn resends the whole history, thinkTimeMs after the last reply. */
  | { name: 'multi-turn'; numTurns: number; inputTokens: number; outputTokens: number; thinkTimeMs?: number; contextTokens?: number }
  | { name: 'distribution'; input: LengthDistribution; output: LengthDistribution };

export const SCENARIO_NAMES = ['fixed', 'shared-prefix', 'multi-turn', 'distribution'] as const;

export function generateWorkload(spec: ScenarioSpec, numRequests: number, rng: Rng): WorkloadEntry[] {
  switch (spec.name) {
    case 'fixed':
      return Array.from({ length: numRequests }, () => ({
        input_tokens: spec.inputTokens,
        output_tokens: spec.outputTokens,
      }));
    case 'shared-prefix': {
      const entries = Array.from({ length: numRequests }, (_, i) => ({
        prefix: { id: `group-${i % spec.numGroups}`, tokens: spec.systemPromptTokens },
        input_tokens: spec.inputTokens,
        output_tokens: spec.outputTokens,
      }));
      // Interleaved groups, as in SGLang's benchmark: the cache must hold many prefixes at once.
      return shuffleInPlace(rng, entries);
    }
    case 'multi-turn':
      return Array.from({ length: numRequests }, (_, i) => ({
        session: `conversation-${Math.floor(i / spec.numTurns)}`,
        ...(spec.thinkTimeMs && i % spec.numTurns > 0 ? { think_time_ms: spec.thinkTimeMs } : {}),
        // A document the conversation is about, its own and resent every turn (vLLM's multi-turn
        // generator opens each conversation on one: its prefix_num_tokens).
        ...(spec.contextTokens ? { prefix: { id: `context-${Math.floor(i / spec.numTurns)}`, tokens: spec.contextTokens } } : {}),
        input_tokens: spec.inputTokens,
        output_tokens: spec.outputTokens,
      }));
    case 'distribution':
      return Array.from({ length: numRequests }, () => ({
        input_tokens: drawLength(rng, spec.input),
        output_tokens: drawLength(rng, spec.output),
      }));
  }
}

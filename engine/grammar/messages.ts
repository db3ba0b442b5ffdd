// What the engine's grammar service and its threads say to each other: plain data.
import type { SharedComputeThreads } from '../compute-threads.ts';
import type { StructuredConstraint } from '../types.ts';

/** A constraint ready to compile: a JSON schema already checked and rewritten (json-schema.ts). */
export type PreparedConstraint = StructuredConstraint;

export interface GrammarThreadInit {
  modelDir: string;
  /** The model's logits: every mask row covers this many ids. */
  vocabSize: number;
  /** Words of one bitmask row: ceil(vocabSize / 32). */
  words: number;
  eosTokenIds: number[];
  /** The rows the native sampler reads, [maxNumSeqs × words] int32. */
  bitmask: SharedArrayBuffer;
  /** One int32: rows written this step. */
  ready: SharedArrayBuffer;
  /** Compiled grammars kept per thread, least recently used out first. */
  maxCachedGrammars: number;
  /** The thread's scheduling niceness (0: the process's own). */
  nice: number;
  /** The compute threads it changes as its busy jobs start and end (compute-threads.ts); null: none to change. */
  computeThreads: SharedComputeThreads | null;
  /** This thread's index in computeThreads.numBusyJobs. */
  threadIndex: number;
}

export interface FillItem {
  slot: number;
  /** Output tokens the matcher has not seen yet, in order. */
  tokenIds: number[];
  row: number;
  /** Also report the text the grammar forces next. */
  jumpForward: boolean;
}

export type ThreadRequest =
  | {
      kind: 'open';
      slot: number;
      key: string;
      constraint: PreparedConstraint;
      constrainAfter: string | null;
      stopTokenIds: number[];
      /** Also report the text the grammar forces from its start ('prefix'), before compiling it. */
      jumpForward: boolean;
      /**
       * A grammar not cached that forces a start: stop after the 'prefix' reply, and compile over
       * the vocabulary (and open the matcher) on the slot's 'compile' request.
       */
      deferCompile: boolean;
      /** The engine counted a compile for it (not cached there): the thread ends it (compute-threads.ts). */
      countsCompile: boolean;
    }
  /** Counted as a compile by the engine, like an open's countsCompile. */
  | { kind: 'compile'; slot: number }
  /** yieldsCore: count the fill like a compile while it runs (compute-threads.ts). */
  | { kind: 'fill'; step: number; items: FillItem[]; yieldsCore: boolean }
  | { kind: 'close'; slot: number };

export type ThreadReply =
  /** What the grammar forces from its start, known before it is compiled (an empty text: nothing). */
  | {
      kind: 'prefix';
      slot: number;
      text: string;
      /** The thread waits for the slot's 'compile' request (an open with deferCompile, and a forced start). */
      deferred: boolean;
    }
  /** compileMs: the compile over the vocabulary alone (0 when cached or failed). */
  | { kind: 'opened'; slot: number; error: string | null; cached: boolean; compileMs: number }
  | { kind: 'filled'; step: number; results: Array<{ slot: number; forcedText: string | null; error: string | null }> };

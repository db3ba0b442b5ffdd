// The scheduler with the fake runner, one engine step at a time, for the scheduler's tests.
import { Scheduler, type SchedulerConfig } from '../scheduler.ts';
import type { SchedulerOutput } from '../scheduler-output.ts';
import type { GenerateRequest, RequestOutput, SamplingParams } from '../types.ts';
import { FakeRunner, distinctPrompt, type TokenScript } from './fake-runner.ts';

export const EOS = 2;
/** More steps than any scheduler test needs. */
const MAX_STEPS = 10_000;

export function setup(overrides: Partial<SchedulerConfig> = {}, script?: TokenScript) {
  const config: SchedulerConfig = {
    numKvBlocks: 64,
    blockSizeTokens: 4,
    maxModelLen: 128,
    vocabSize: 1000,
    maxNumSeqs: 8,
    maxNumBatchedTokens: 64,
    // Every prompt the budget holds, unless a test says otherwise (scheduler-prefill-policy.test.ts).
    maxNumPartialPrefills: 64,
    maxLongPartialPrefills: 64,
    longPrefillTokenThreshold: 0,
    generationDefaults: { eosTokenIds: [EOS] },
    modelName: 'test-model',
    enablePrefixCaching: false,
    policy: 'fcfs',
    ...overrides,
  };
  const scheduler = new Scheduler(config);
  const runner = new FakeRunner(
    {
      numKvBlocks: config.numKvBlocks,
      blockSizeTokens: config.blockSizeTokens,
      vocabSize: config.vocabSize,
      maxModelLen: config.maxModelLen,
    },
    script,
  );
  let numSteps = 0;
  /** One engine step: schedule, execute, update. */
  async function step(): Promise<{ output: SchedulerOutput; news: RequestOutput[] }> {
    // Tests step until the scheduler is done; one that never is would spin on microtasks, where
    // no test timeout can interrupt it.
    if (++numSteps > MAX_STEPS) throw new Error(`more than ${MAX_STEPS} steps: the scheduler never finishes`);
    const output = scheduler.schedule();
    const news = scheduler.update(output, await runner.execute(output));
    return { output, news };
  }
  return { scheduler, runner, step };
}

/** A request with a prompt of its own (distinctPrompt), so that no two requests share a block by accident. */
export function request(requestId: string, numPromptTokens: number, sampling: SamplingParams = {}): GenerateRequest {
  return { requestId, promptTokenIds: distinctPrompt(requestId, numPromptTokens), sampling };
}

export function plan(output: SchedulerOutput): string[] {
  return output.scheduled.map((entry) => `${entry.requestId}:${entry.numScheduledTokens}${entry.sample ? '*' : ''}`);
}


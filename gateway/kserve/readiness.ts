// Triton's readiness for the LLMs served beside the repository's models: a model is ready while
// one of its workers has a live engine stream (it has reported a load), and the server is ready
// when every model is, the repository's and the LLMs alike.
import type { ModelRepository } from '../../triton/index.ts';

export interface LlmWorkers {
  readonly name: string;
  readonly workers: readonly { readonly load: unknown }[];
}

export function isLlmReady(model: LlmWorkers): boolean {
  return model.workers.some((worker) => worker.load !== null);
}

export function isServerReady(repository: ModelRepository, llms: readonly LlmWorkers[]): boolean {
  return repository.isReady() && llms.every(isLlmReady);
}

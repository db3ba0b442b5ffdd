// The contract between a model and the code that runs it: one instance executes one batch at a
// time; the batcher gives it tensors whose dim 0 is the batch (when max_batch_size > 0).
import type { ModelConfig } from './model-config.ts';
import type { Tensor } from './tensor.ts';

export type TensorMap = Record<string, Tensor>;

export interface ModelInstance {
  execute(inputs: TensorMap): Promise<TensorMap>;
  close(): Promise<void>;
}

export interface InstanceSpec {
  config: ModelConfig;
  /** `<repo>/<model>`. */
  modelDir: string;
  version: number;
  instanceIndex: number;
}

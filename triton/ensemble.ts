// An ensemble runs as a dataflow DAG in one request: a step starts as soon as every tensor it
// maps in exists, so independent steps run at once; each step is a request to its own model,
// which batches it with that model's other traffic.
import type { TensorMap } from './backend.ts';
import { ClassicError } from './errors.ts';
import type { ModelConfig } from './model-config.ts';
import type { InferRequest } from './served-version.ts';
import type { Tensor } from './tensor.ts';

/** Runs one step: model, version (-1 = latest ready), request. */
export type StepRunner = (modelName: string, version: number, request: InferRequest) => Promise<TensorMap>;

/** Checks the DAG at load time: every tensor has one producer, nothing is unreachable, no cycles. */
export function checkEnsemble(config: ModelConfig): void {
  const steps = config.ensemble_scheduling?.step ?? [];
  const producer = new Map<string, number>();
  for (const input of config.input) producer.set(input.name, -1);
  steps.forEach((step, i) => {
    for (const tensor of Object.values(step.output_map)) {
      if (producer.has(tensor)) throw new ClassicError('INVALID_ARG', `ensemble '${config.name}': tensor '${tensor}' is produced more than once`);
      producer.set(tensor, i);
    }
  });
  const done = new Set<number>();
  const available = new Set(config.input.map((input) => input.name));
  while (done.size < steps.length) {
    const ready = steps.findIndex((step, i) => !done.has(i) && Object.values(step.input_map).every((tensor) => available.has(tensor)));
    if (ready === -1) {
      const stuck = steps.find((_, i) => !done.has(i))!;
      const lacking = Object.values(stuck.input_map).filter((tensor) => !available.has(tensor));
      throw new ClassicError('INVALID_ARG', `ensemble '${config.name}': step '${stuck.model_name}' needs ${lacking.map((t) => `'${t}'`).join(', ')}, which no step produces before it (or a cycle)`);
    }
    done.add(ready);
    for (const tensor of Object.values(steps[ready].output_map)) available.add(tensor);
  }
  for (const output of config.output) {
    if (!available.has(output.name)) throw new ClassicError('INVALID_ARG', `ensemble '${config.name}': no step produces output '${output.name}'`);
  }
}

export async function runEnsemble(config: ModelConfig, request: InferRequest, runStep: StepRunner): Promise<TensorMap> {
  const tensors = new Map<string, Promise<Tensor>>();
  const settlers = new Map<string, { resolve(tensor: Tensor): void; reject(err: Error): void }>();
  const promiseOf = (name: string) => {
    let promise = tensors.get(name);
    if (promise === undefined) {
      promise = new Promise<Tensor>((resolve, reject) => settlers.set(name, { resolve, reject }));
      // A step that fails rejects tensors nobody may await; the request's own await reports it.
      promise.catch(() => {});
      tensors.set(name, promise);
    }
    return promise;
  };
  for (const [name, tensor] of Object.entries(request.inputs)) tensors.set(name, Promise.resolve(tensor));
  const steps = config.ensemble_scheduling!.step.map(async (step) => {
    for (const tensor of Object.values(step.output_map)) promiseOf(tensor);
    try {
      const inputs: TensorMap = {};
      await Promise.all(Object.entries(step.input_map).map(async ([stepInput, tensor]) => { inputs[stepInput] = await promiseOf(tensor); }));
      const outputs = await runStep(step.model_name, step.model_version, {
        inputs, requestedOutputs: Object.keys(step.output_map), priority: request.priority, timeoutUs: request.timeoutUs,
      });
      for (const [stepOutput, tensor] of Object.entries(step.output_map)) settlers.get(tensor)!.resolve(outputs[stepOutput]);
    } catch (err) {
      for (const tensor of Object.values(step.output_map)) settlers.get(tensor)!.reject(err as Error);
      throw err;
    }
  });
  const outputs: TensorMap = {};
  const names = request.requestedOutputs ?? config.output.map((output) => output.name);
  const settled = await Promise.allSettled([...steps, ...names.map(async (name) => { outputs[name] = await promiseOf(name); })]);
  const failure = settled.find((result) => result.status === 'rejected');
  if (failure !== undefined) throw (failure as PromiseRejectedResult).reason;
  return outputs;
}

// The script backend: a TypeScript module at `<model>/<version>/model.ts` (or a plain `model.js`;
// the config's default_model_filename to override) for pre- and post-processing and business
// logic, like Triton's Python backend. It runs on the gateway's thread: keep heavy compute in
// ONNX models. Users' scripts are the one thing the compiled server loads through tsx.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import type { InstanceSpec, ModelInstance, TensorMap } from './backend.ts';
import { ClassicError } from './errors.ts';
import { fileInRepository, shownPath } from './repository-paths.ts';
import type { ModelConfig } from './model-config.ts';

export interface ScriptInitializeArgs {
  modelConfig: ModelConfig;
  modelDir: string;
  modelVersion: number;
  instanceIndex: number;
}

/** What a script module exports. execute gets one batch (dim 0 is the batch when max_batch_size > 0). */
export interface ScriptModule {
  initialize?(args: ScriptInitializeArgs): void | Promise<void>;
  execute(inputs: TensorMap): TensorMap | Promise<TensorMap>;
  finalize?(): void | Promise<void>;
}

class ScriptInstance implements ModelInstance {
  constructor(private readonly module: ScriptModule, private readonly file: string) {}

  async execute(inputs: TensorMap): Promise<TensorMap> {
    try {
      return await this.module.execute(inputs);
    } catch (err) {
      if (err instanceof ClassicError) throw err;
      throw new ClassicError('INTERNAL', `${path.basename(this.file)}: ${(err as Error).message}`);
    }
  }

  async close(): Promise<void> {
    await this.module.finalize?.();
  }
}

/** The configured file's name, else model.ts, else model.js. */
function scriptName(versionDir: string, configuredName: string | undefined): string {
  if (configuredName !== undefined) return configuredName;
  return existsSync(path.join(versionDir, 'model.ts')) || !existsSync(path.join(versionDir, 'model.js')) ? 'model.ts' : 'model.js';
}

export async function createScriptInstance(spec: InstanceSpec): Promise<ModelInstance> {
  const parts = [String(spec.version), scriptName(path.join(spec.modelDir, String(spec.version)), spec.config.default_model_filename)];
  const file = fileInRepository(spec.modelDir, ...parts);
  const shownFile = shownPath(spec.modelDir, ...parts);
  if (!existsSync(file)) throw new ClassicError('NOT_FOUND', `${shownFile}: no such script`);
  // Imported here, not at the top: a server without script models never starts tsx's esbuild.
  const { tsImport } = await import('tsx/esm/api');
  // tsImport loads the file afresh in a namespace of its own: each instance has its own module
  // state, and a reload reads the new file (a plain import() would return the cached module).
  const module = (await tsImport(pathToFileURL(file).href, { parentURL: import.meta.url })) as Partial<ScriptModule>;
  if (typeof module.execute !== 'function') throw new ClassicError('INVALID_ARG', `${shownFile}: exports no execute function`);
  await module.initialize?.({ modelConfig: spec.config, modelDir: spec.modelDir, modelVersion: spec.version, instanceIndex: spec.instanceIndex });
  return new ScriptInstance(module as ScriptModule, file);
}

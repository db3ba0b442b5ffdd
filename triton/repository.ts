// The model repository at run time: which models and versions are loaded, their states, and the
// model control modes. `none` loads everything at start; `poll` also rescans every interval and
// reloads what changed; `explicit` loads only the startup list, then what the API asks for.
// A reload builds the new versions first and swaps them in; requests in flight finish on the old
// ones, which are then drained and closed. Instances are bounded per model and in total, so no
// config (a file, or an override sent with a load request) can spawn threads without end; a
// close() stops the loads in progress between two instances.
import { existsSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { silentLogger, type Logger } from '../engine/log.ts';
import type { TensorMap } from './backend.ts';
import { checkEnsemble } from './ensemble.ts';
import { ClassicError } from './errors.ts';
import { ModelConfigError, validateModelConfig, type ModelConfig } from './model-config.ts';
import { listModelNames, listVersions, readModelSource, selectVersions } from './repository-scan.ts';
import { ResponseCache } from './response-cache.ts';
import { loadVersion, type InferRequest, type ServedVersion } from './served-version.ts';

export type ModelControlMode = 'none' | 'poll' | 'explicit';
export type ModelState = 'READY' | 'UNAVAILABLE' | 'LOADING' | 'UNLOADING';

export interface RepositoryOptions {
  repoDir: string;
  mode: ModelControlMode;
  /** poll mode: ms between rescans. */
  pollIntervalMs: number;
  /** explicit mode: models loaded at start (`*` for all). */
  startupModels: string[];
  /** The response cache's size in bytes (Triton's `--cache-config local,size=`); 0 or unset: no cache. */
  responseCacheBytes?: number;
  /** Loads, unloads and failures, each with the `model` it concerns; unset: silent. */
  logger?: Logger;
  /** Instances one model may have, over all its versions; defaultInstanceLimits() when unset. */
  maxInstancesPerModel?: number;
  /** Instances of all models together; defaultInstanceLimits() when unset. */
  maxInstances?: number;
}

/**
 * Each ONNX instance is a thread with its own session (the model's weights again), each script
 * instance a module of its own: a few per core is plenty for any batching (Triton's CPU default
 * is 2 per model), and far from the thousands a config could otherwise ask for.
 */
export function defaultInstanceLimits(numCores = os.availableParallelism()): { perModel: number; total: number } {
  return { perModel: Math.max(4, 2 * numCores), total: Math.max(64, 16 * numCores) };
}

export interface ModelIndexEntry {
  name: string;
  version: string;
  state: ModelState;
  reason: string;
}

interface ModelEntry {
  name: string;
  state: ModelState;
  reason: string;
  config: ModelConfig | null;
  versions: Map<number, ServedVersion>;
  /** The loaded versions' instances, counted against the limits. */
  numInstances: number;
  /**
   * The model should be loaded: at start (or found by polling), or once a load request
   * succeeded; an unload clears it. Readiness counts these only, so a refused load request
   * changes nothing.
   */
  required: boolean;
  fingerprint: string;
  /** Serializes loads and unloads of this model. */
  busy: Promise<void>;
}

/** The models an ensemble's steps run (none for any other model). */
function composingModelsOf(config: ModelConfig | null): string[] {
  return [...new Set(config?.ensemble_scheduling?.step.map((step) => step.model_name) ?? [])];
}

/** Instances one loaded version of the config runs (an ensemble's steps run on their own models). */
function instancesPerVersion(config: ModelConfig): number {
  return config.instance_group.reduce((sum, group) => sum + group.count, 0);
}

/** The versions a config sent with a load request serves, refused as a file's would be when there are none. */
function overrideVersions(config: ModelConfig, dir: string): number[] {
  const available = existsSync(dir) ? listVersions(dir) : [];
  if (available.length === 0) throw new ClassicError('INVALID_ARG', `failed to load '${config.name}': no version folders (1/, 2/, ...)`);
  const versions = selectVersions(config, available);
  if (versions.length === 0) {
    throw new ClassicError('INVALID_ARG', `failed to load '${config.name}': version_policy serves none of the versions present (${available.join(', ')})`);
  }
  return versions;
}

export class ModelRepository {
  private readonly models = new Map<string, ModelEntry>();
  private pollTimer: NodeJS.Timeout | null = null;
  private readonly log: Logger;
  /** Shared by the models that enable response_cache; null when the server has none. */
  readonly responseCache: ResponseCache | null;
  private readonly maxInstancesPerModel: number;
  private readonly maxInstances: number;
  /** Instances the loads in progress are making, counted before they exist. */
  private numReservedInstances = 0;
  /** Aborted by close(): a load in progress stops before its next instance. */
  private readonly closing = new AbortController();

  constructor(private readonly options: RepositoryOptions) {
    this.log = options.logger ?? silentLogger;
    this.responseCache = (options.responseCacheBytes ?? 0) > 0 ? new ResponseCache(options.responseCacheBytes!) : null;
    const defaults = defaultInstanceLimits();
    this.maxInstancesPerModel = options.maxInstancesPerModel ?? defaults.perModel;
    this.maxInstances = options.maxInstances ?? defaults.total;
  }

  async start(): Promise<void> {
    const { mode, startupModels } = this.options;
    const names = mode === 'explicit'
      ? (startupModels.includes('*') ? listModelNames(this.options.repoDir) : startupModels)
      : listModelNames(this.options.repoDir);
    for (const name of names) this.require(name);
    await Promise.all(names.map((name) => this.loadModel(name, null).catch(() => {})));
    if (mode === 'poll') {
      this.pollTimer = setInterval(() => void this.poll(), this.options.pollIntervalMs);
      this.pollTimer.unref();
    }
  }

  /** Every model found in the repository or loaded, with each version's state. */
  index(readyOnly: boolean): ModelIndexEntry[] {
    const entries: ModelIndexEntry[] = [];
    const names = new Set([...listModelNames(this.options.repoDir), ...this.models.keys()]);
    for (const name of [...names].sort()) {
      const model = this.models.get(name);
      if (model === undefined || (model.versions.size === 0 && model.state !== 'READY')) {
        if (!readyOnly) entries.push({ name, version: '', state: model?.state ?? 'UNAVAILABLE', reason: model?.reason ?? 'unloaded' });
        continue;
      }
      for (const version of model.versions.keys()) entries.push({ name, version: String(version), state: model.state, reason: model.reason });
    }
    return readyOnly ? entries.filter((entry) => entry.state === 'READY') : entries;
  }

  /** Ready when every model that should be loaded (see ModelEntry.required) has loaded. */
  isReady(): boolean {
    for (const model of this.models.values()) if (model.required && model.state !== 'READY' && model.state !== 'UNLOADING') return false;
    return true;
  }

  /** A ready version: the given one, or the highest loaded. */
  get(name: string, version: number | null): ServedVersion {
    const model = this.models.get(name);
    if (model === undefined || (model.versions.size === 0 && model.state !== 'LOADING')) {
      throw new ClassicError('NOT_FOUND', `Request for unknown model: '${name}' is not found`);
    }
    if (model.versions.size === 0) throw new ClassicError('UNAVAILABLE', `Request for unknown model: '${name}' has no available versions`);
    if (version === null) return model.versions.get(Math.max(...model.versions.keys()))!;
    const served = model.versions.get(version);
    if (served === undefined) throw new ClassicError('NOT_FOUND', `Request for unknown model: '${name}' version ${version} is not found`);
    return served;
  }

  /** Every model's versions, for statistics. */
  loadedVersions(): ServedVersion[] {
    return [...this.models.values()].flatMap((model) => [...model.versions.values()]);
  }

  infer(name: string, version: number | null, request: InferRequest): Promise<TensorMap> {
    let served: ServedVersion;
    try {
      served = this.get(name, version);
    } catch (err) {
      return Promise.reject(err);
    }
    return served.infer(request);
  }

  /** The API's load: explicit mode only. `configJson` replaces the config on disk. */
  async load(name: string, configJson: string | null): Promise<void> {
    if (this.options.mode !== 'explicit') throw new ClassicError('UNAVAILABLE', 'explicit model load / unload is not allowed if polling is enabled');
    await this.loadModel(name, configJson);
  }

  async unload(name: string, unloadDependents: boolean): Promise<void> {
    if (this.options.mode !== 'explicit') throw new ClassicError('UNAVAILABLE', 'explicit model load / unload is not allowed if polling is enabled');
    const model = this.models.get(name);
    if (model === undefined) throw new ClassicError('INVALID_ARG', `failed to unload '${name}', no version is available`);
    model.required = false;
    const composing = composingModelsOf(model.config);
    await this.unloadModel(model);
    if (!unloadDependents) return;
    for (const other of this.models.values()) {
      if (!composingModelsOf(other.config).includes(name)) continue;
      other.required = false;
      await this.unloadModel(other);
    }
    await this.unloadUnused(composing);
  }

  /**
   * An unloaded ensemble's composing models (and theirs, for nested ensembles), each unless a
   * model still loaded uses it, as Triton's unload_dependents does.
   */
  private async unloadUnused(names: readonly string[]): Promise<void> {
    for (const name of names) {
      const model = this.models.get(name);
      if (model === undefined || model.versions.size === 0) continue;
      const isUsed = [...this.models.values()].some((other) => other.versions.size > 0 && composingModelsOf(other.config).includes(name));
      if (isUsed) continue;
      const ownComposing = composingModelsOf(model.config);
      model.required = false;
      await this.unloadModel(model);
      await this.unloadUnused(ownComposing);
    }
  }

  async close(): Promise<void> {
    if (this.pollTimer !== null) clearInterval(this.pollTimer);
    this.closing.abort();
    await Promise.all([...this.models.values()].map((model) => this.unloadModel(model)));
  }

  private entry(name: string): ModelEntry {
    let model = this.models.get(name);
    if (model === undefined) {
      model = {
        name, state: 'UNAVAILABLE', reason: 'unloaded', config: null, versions: new Map(), numInstances: 0, required: false, fingerprint: '',
        busy: Promise.resolve(),
      };
      this.models.set(name, model);
    }
    return model;
  }

  private require(name: string): void {
    if (/^[A-Za-z0-9_.-]+$/.test(name) && !name.startsWith('.')) this.entry(name).required = true;
  }

  /** Refuses a load whose instances would pass either limit; the model's own loaded instances make way for the new ones. */
  private checkInstances(model: ModelEntry, numInstances: number): void {
    if (numInstances > this.maxInstancesPerModel) {
      throw new ClassicError('INVALID_ARG',
        `failed to load '${model.name}': it asks for ${numInstances} instances (instance_group counts times versions), ` +
        `more than the ${this.maxInstancesPerModel} one model may have (model_repository.max_instances_per_model)`);
    }
    let numOtherInstances = this.numReservedInstances;
    for (const other of this.models.values()) if (other !== model) numOtherInstances += other.numInstances;
    if (numOtherInstances + numInstances > this.maxInstances) {
      throw new ClassicError('INVALID_ARG',
        `failed to load '${model.name}': its ${numInstances} instances and the ${numOtherInstances} of the other models ` +
        `would pass the ${this.maxInstances} the server may have (model_repository.max_instances)`);
    }
  }

  private serialized(model: ModelEntry, work: () => Promise<void>): Promise<void> {
    const run = model.busy.then(work);
    model.busy = run.catch(() => {});
    return run;
  }

  private loadModel(name: string, configJson: string | null, loadingDependents = new Set<string>()): Promise<void> {
    if (!/^[A-Za-z0-9_.-]+$/.test(name) || name.startsWith('.')) {
      return Promise.reject(new ClassicError('INVALID_ARG', `invalid model name '${name}'`));
    }
    const model = this.entry(name);
    if (model.versions.size === 0) model.state = 'LOADING';
    return this.serialized(model, async () => {
      const dir = path.join(this.options.repoDir, name);
      if (model.versions.size === 0) model.state = 'LOADING';
      try {
        if (!existsSync(dir) && configJson === null) throw new ClassicError('INVALID_ARG', `failed to load '${name}', failed to poll from model repository`);
        let config: ModelConfig;
        let versions: number[];
        let fingerprint: string;
        if (configJson === null) {
          ({ config, versions, fingerprint } = readModelSource(this.options.repoDir, name));
        } else {
          let raw: unknown;
          try {
            raw = JSON.parse(configJson);
          } catch (err) {
            throw new ClassicError('INVALID_ARG', `failed to load '${name}': config is not JSON: ${(err as Error).message}`);
          }
          config = validateModelConfig(raw, name, 'config', () => 1);
          versions = config.backend === 'ensemble' && !existsSync(dir) ? [1] : overrideVersions(config, dir);
          fingerprint = `override:${configJson}`;
        }
        if (config.backend === 'ensemble') {
          checkEnsemble(config);
          // Loading an ensemble loads the models it is made of.
          loadingDependents.add(name);
          for (const step of config.ensemble_scheduling!.step) {
            if (loadingDependents.has(step.model_name)) throw new ClassicError('INVALID_ARG', `ensemble '${name}' contains itself through '${step.model_name}'`);
            const dependency = this.models.get(step.model_name);
            if (dependency?.state === 'LOADING') await dependency.busy;
            else if (dependency?.state !== 'READY') await this.loadModel(step.model_name, null, loadingDependents);
            if (this.models.get(step.model_name)?.state !== 'READY') {
              throw new ClassicError('INVALID_ARG', `ensemble '${name}' needs '${step.model_name}', which did not load`);
            }
          }
        }
        const runStep = (stepModel: string, stepVersion: number, request: InferRequest) =>
          this.infer(stepModel, stepVersion === -1 ? null : stepVersion, request);
        const numInstances = instancesPerVersion(config) * versions.length;
        this.checkInstances(model, numInstances);
        const loaded = new Map<number, ServedVersion>();
        this.numReservedInstances += numInstances;
        try {
          if (config.response_cache?.enable === true && this.responseCache === null) {
            this.log.warn({ model: name }, `model '${name}': response_cache is enabled but the server has no response cache (model_repository.response_cache_bytes): not caching`);
          }
          for (const version of versions) {
            loaded.set(version, await loadVersion({ config, modelDir: dir, version }, runStep, this.responseCache, this.closing.signal, this.log));
          }
        } catch (err) {
          await Promise.all([...loaded.values()].map((served) => served.close()));
          throw err;
        } finally {
          this.numReservedInstances -= numInstances;
        }
        const old = model.versions;
        model.versions = loaded;
        model.numInstances = numInstances;
        model.required = true;
        model.config = config;
        model.fingerprint = fingerprint;
        model.state = 'READY';
        model.reason = '';
        this.log.info({ model: name, versions }, `loaded ${name} version${versions.length > 1 ? 's' : ''} ${versions.join(', ')}`);
        await Promise.all([...old.values()].map((served) => served.close()));
      } catch (err) {
        const message = err instanceof ClassicError || err instanceof ModelConfigError ? err.message : `${(err as Error).message}`;
        // A failed reload keeps the versions that serve.
        if (model.versions.size === 0) {
          model.state = 'UNAVAILABLE';
          model.reason = message;
          // A name the repository does not hold, never loaded: nothing to list, nothing changed.
          if (!model.required && !existsSync(dir) && this.models.get(name) === model) this.models.delete(name);
        }
        this.log.error({ model: name, reason: message }, `cannot load ${name}: ${message}`);
        throw err instanceof ClassicError ? err : new ClassicError('INVALID_ARG', `failed to load '${name}': ${message}`);
      }
    });
  }

  private unloadModel(model: ModelEntry): Promise<void> {
    return this.serialized(model, async () => {
      if (model.versions.size === 0) {
        if (!model.required) model.reason = 'unloaded';
        return;
      }
      const old = model.versions;
      model.state = 'UNLOADING';
      model.versions = new Map();
      await Promise.all([...old.values()].map((served) => served.close()));
      model.numInstances = 0;
      model.state = 'UNAVAILABLE';
      model.reason = 'unloaded';
      model.config = null;
      this.log.info({ model: model.name }, `unloaded ${model.name}`);
    });
  }

  private async poll(): Promise<void> {
    const names = new Set(listModelNames(this.options.repoDir));
    for (const name of names) {
      const model = this.models.get(name);
      let fingerprint: string;
      try {
        fingerprint = readModelSource(this.options.repoDir, name).fingerprint;
      } catch {
        fingerprint = 'invalid';
      }
      if (model !== undefined && model.fingerprint === fingerprint) continue;
      if (model !== undefined && fingerprint === 'invalid' && model.versions.size > 0) continue;
      this.require(name);
      await this.loadModel(name, null).catch(() => {});
      if (fingerprint === 'invalid') this.entry(name).fingerprint = fingerprint;
    }
    for (const model of this.models.values()) {
      if (names.has(model.name)) continue;
      model.required = false;
      if (model.versions.size > 0) await this.unloadModel(model);
    }
  }
}

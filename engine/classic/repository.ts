// The model repository at run time: which models and versions are loaded, their states, and the
// model control modes. `none` loads everything at start; `poll` also rescans every interval and
// reloads what changed; `explicit` loads only the startup list, then what the API asks for.
// A reload builds the new versions first and swaps them in; requests in flight finish on the old
// ones, which are then drained and closed.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { silentLogger, type Logger } from '../log.ts';
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
  fingerprint: string;
  /** Serializes loads and unloads of this model. */
  busy: Promise<void>;
}

export class ModelRepository {
  private readonly models = new Map<string, ModelEntry>();
  private pollTimer: NodeJS.Timeout | null = null;
  private readonly log: Logger;
  /** Shared by the models that enable response_cache; null when the server has none. */
  readonly responseCache: ResponseCache | null;

  constructor(private readonly options: RepositoryOptions) {
    this.log = options.logger ?? silentLogger;
    this.responseCache = (options.responseCacheBytes ?? 0) > 0 ? new ResponseCache(options.responseCacheBytes!) : null;
  }

  async start(): Promise<void> {
    const { mode, startupModels } = this.options;
    const names = mode === 'explicit'
      ? (startupModels.includes('*') ? listModelNames(this.options.repoDir) : startupModels)
      : listModelNames(this.options.repoDir);
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

  /** Ready when every model that was asked for has loaded. */
  isReady(): boolean {
    for (const model of this.models.values()) if (model.state !== 'READY' && model.state !== 'UNLOADING' && model.reason !== 'unloaded') return false;
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
    await this.unloadModel(model);
    if (!unloadDependents) return;
    for (const other of this.models.values()) {
      if (other.config?.ensemble_scheduling?.step.some((step) => step.model_name === name)) await this.unloadModel(other);
    }
  }

  async close(): Promise<void> {
    if (this.pollTimer !== null) clearInterval(this.pollTimer);
    await Promise.all([...this.models.values()].map((model) => this.unloadModel(model)));
  }

  private entry(name: string): ModelEntry {
    let model = this.models.get(name);
    if (model === undefined) {
      model = { name, state: 'UNAVAILABLE', reason: 'unloaded', config: null, versions: new Map(), fingerprint: '', busy: Promise.resolve() };
      this.models.set(name, model);
    }
    return model;
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
          versions = config.backend === 'ensemble' && !existsSync(dir) ? [1] : selectVersions(config, listVersions(dir));
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
        const loaded = new Map<number, ServedVersion>();
        try {
          if (config.response_cache?.enable === true && this.responseCache === null) {
            this.log.warn({ model: name }, `model '${name}': response_cache is enabled but the server has no response cache (model_repository.response_cache_bytes): not caching`);
          }
          for (const version of versions) loaded.set(version, await loadVersion({ config, modelDir: dir, version }, runStep, this.responseCache));
        } catch (err) {
          await Promise.all([...loaded.values()].map((served) => served.close()));
          throw err;
        }
        const old = model.versions;
        model.versions = loaded;
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
        }
        this.log.error({ model: name, reason: message }, `cannot load ${name}: ${message}`);
        throw err instanceof ClassicError ? err : new ClassicError('INVALID_ARG', `failed to load '${name}': ${message}`);
      }
    });
  }

  private unloadModel(model: ModelEntry): Promise<void> {
    return this.serialized(model, async () => {
      if (model.versions.size === 0) return;
      const old = model.versions;
      model.state = 'UNLOADING';
      model.versions = new Map();
      await Promise.all([...old.values()].map((served) => served.close()));
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
      await this.loadModel(name, null).catch(() => {});
      if (fingerprint === 'invalid') this.entry(name).fingerprint = fingerprint;
    }
    for (const model of this.models.values()) {
      if (!names.has(model.name) && model.versions.size > 0) await this.unloadModel(model);
    }
  }
}

// What a model repository holds on disk: each `<repo>/<model>/` with config.pbtxt or
// config.yaml, and its numbered version folders, filtered by the version policy.
import { existsSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { CONFIG_FILES, ModelConfigError, readModelConfig, type ModelConfig } from './model-config.ts';
import { fileInRepository, shownPath } from './repository-paths.ts';

export interface ModelSource {
  name: string;
  dir: string;
  configFile: string;
  config: ModelConfig;
  /** The versions the policy serves, ascending. */
  versions: number[];
  /** Changes when the config or any served version's files change (poll mode reloads on it). */
  fingerprint: string;
}

/** Numbered version folders, ascending. Names that are not numbers or start with 0 are ignored, as Triton does. */
export function listVersions(modelDir: string): number[] {
  return readdirSync(modelDir, { withFileTypes: true })
    .filter((entry) => entry.isDirectory() && /^[1-9]\d*$/.test(entry.name))
    .map((entry) => Number(entry.name))
    .sort((a, b) => a - b);
}

export function selectVersions(config: ModelConfig, available: readonly number[]): number[] {
  const policy = config.version_policy;
  if ('all' in policy) return [...available];
  if ('specific' in policy) return available.filter((version) => policy.specific.versions.includes(version));
  return available.slice(-policy.latest.num_versions);
}

function treeFingerprint(dir: string): string {
  const parts: string[] = [];
  const walk = (current: string) => {
    for (const entry of readdirSync(current, { withFileTypes: true }).sort((a, b) => a.name.localeCompare(b.name))) {
      const full = path.join(current, entry.name);
      if (entry.isDirectory()) walk(full);
      else {
        const stat = statSync(full);
        parts.push(`${path.relative(dir, full)}:${stat.size}:${stat.mtimeMs}`);
      }
    }
  };
  walk(dir);
  return parts.join('|');
}

/** Model folders: every folder that holds a config file (others, like an LLM checkpoint, are not ours). */
export function listModelNames(repoDir: string): string[] {
  return readdirSync(repoDir, { withFileTypes: true })
    .filter((entry) => entry.isDirectory() && CONFIG_FILES.some((file) => existsSync(path.join(repoDir, entry.name, file))))
    .map((entry) => entry.name)
    .sort();
}

/** Errors name the model's files relative to the repository (`digits/config.pbtxt`). */
export function readModelSource(repoDir: string, name: string): ModelSource {
  const dir = path.join(repoDir, name);
  const configNames = CONFIG_FILES.filter((file) => existsSync(path.join(dir, file)));
  if (configNames.length === 0) throw new ModelConfigError(`${name}: no config.pbtxt or config.yaml`);
  if (configNames.length > 1) throw new ModelConfigError(`${name}: both config.pbtxt and config.yaml; keep one`);
  const configFile = fileInRepository(dir, configNames[0]);
  const config = readModelConfig(dir, configFile, shownPath(dir, configNames[0]));
  const available = listVersions(dir);
  if (available.length === 0) throw new ModelConfigError(`${name}: no version folders (1/, 2/, ...)`);
  const versions = selectVersions(config, available);
  if (versions.length === 0) {
    throw new ModelConfigError(`${shownPath(dir, configNames[0])}: version_policy serves none of the versions present (${available.join(', ')})`);
  }
  return { name, dir, configFile, config, versions, fingerprint: treeFingerprint(dir) };
}

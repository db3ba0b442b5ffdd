// The files a model reads, inside its repository: each one is opened only if its real path (every
// symlink on the way resolved) stays inside the repository's, so a version folder holding a link
// to /etc/passwd, or a model folder linked elsewhere, is refused rather than read. Errors name
// files relative to the repository (`digits/1/model.onnx`), never by the server's absolute path.
import { realpathSync } from 'node:fs';
import path from 'node:path';
import { ClassicError } from './errors.ts';

/** How errors show a model's file: from the model's folder name down. */
export function shownPath(modelDir: string, ...parts: string[]): string {
  return path.join(path.basename(modelDir), ...parts);
}

/** Text that may quote absolute paths of the repository (a runtime's own error), with each one shown relative to it. */
export function withShownPaths(text: string, repoDir: string): string {
  const prefixes = new Set([path.resolve(repoDir) + path.sep]);
  try {
    prefixes.add(realpathSync(repoDir) + path.sep);
  } catch {
    // The repository is gone: its path alone is quoted.
  }
  let shown = text;
  for (const prefix of prefixes) shown = shown.replaceAll(prefix, '');
  return shown;
}

/**
 * modelDir/parts as the path to open. Refused (INVALID_ARG) when it exists but resolves outside
 * the repository (modelDir's parent): a symlink leaving it. A missing file is returned as is, for
 * the caller to report.
 */
export function fileInRepository(modelDir: string, ...parts: string[]): string {
  const file = path.join(modelDir, ...parts);
  let realFile: string;
  let realRepo: string;
  try {
    realFile = realpathSync(file);
    realRepo = realpathSync(path.dirname(modelDir));
  } catch {
    return file;
  }
  if (!realFile.startsWith(realRepo + path.sep)) {
    throw new ClassicError('INVALID_ARG', `${shownPath(modelDir, ...parts)}: a symbolic link out of the model repository; not followed`);
  }
  return file;
}

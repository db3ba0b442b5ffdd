// The programs outside npm that the tests run: a real redis-server (router/ shared state), a
// Chromium (the chat page's browser tests, through playwright-core) and MPICH (the MPI
// tensor-parallel transport). One place resolves where
// each is, so the test-prerequisites check and the tests agree on what "installed" means.
import { accessSync, constants } from 'node:fs';
import path from 'node:path';

export interface SystemTool {
  /** The Debian package that provides it. */
  debianPackage: string;
  /** Its executable, or null when it is not installed. */
  executable(): string | null;
}

/** name's first executable file on PATH, as a shell finds it. */
export function findOnPath(name: string, searchPath = process.env.PATH ?? ''): string | null {
  for (const dir of searchPath.split(path.delimiter)) {
    if (dir === '') continue;
    const candidate = path.join(dir, name);
    try {
      accessSync(candidate, constants.X_OK);
      return candidate;
    } catch {
      // Not here: the next directory.
    }
  }
  return null;
}

export const redisServer: SystemTool = {
  debianPackage: 'redis-server',
  executable: () => findOnPath('redis-server'),
};

/** CHROMIUM_PATH names another Chromium build (or Chrome); otherwise Debian's `chromium` on PATH. */
export const chromium: SystemTool = {
  debianPackage: 'chromium',
  executable: () => process.env.CHROMIUM_PATH || findOnPath('chromium'),
};

/** MPICH's launcher: the MPI tensor-parallel transport's test starts its ranks with it (Debian names it mpiexec.mpich). */
export const mpich: SystemTool = {
  debianPackage: 'mpich',
  executable: () => findOnPath('mpiexec.mpich'),
};

export const SYSTEM_TOOLS: readonly SystemTool[] = [redisServer, chromium, mpich];

/** The executable of a tool the prerequisites check has vouched for (npm test runs it first). */
export function requireExecutable(tool: SystemTool): string {
  const executable = tool.executable();
  if (executable === null) throw new Error(`${tool.debianPackage} is not installed: npm test installs or names it before any test runs`);
  return executable;
}

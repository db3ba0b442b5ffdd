// The directory holding package.json: the one anchor for every file the compiled tree does not
// hold (proto/, configs/, models/, the native addon, the chat page's HTML). Modules run from the
// sources (tsx, the tests) or from dist/ (a level deeper), so this looks upward for package.json
// instead of counting levels. Imports only Node built-ins: every folder may import it.
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

function findPackageRoot(startDir: string): string {
  for (let dir = startDir; ; dir = path.dirname(dir)) {
    if (existsSync(path.join(dir, 'package.json'))) return dir;
    if (path.dirname(dir) === dir) throw new Error(`conduit: no package.json in ${startDir} or above it`);
  }
}

export const packageRoot = findPackageRoot(path.dirname(fileURLToPath(import.meta.url)));

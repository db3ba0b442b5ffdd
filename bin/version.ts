// Conduit's version: package.json's, which `conduit --version` prints and KServe v2's server
// metadata (/v2, gRPC ServerMetadata) reports.
import { readFileSync } from 'node:fs';
import path from 'node:path';
import { packageRoot } from '../package-root.ts';

export const CONDUIT_VERSION: string = JSON.parse(readFileSync(path.join(packageRoot, 'package.json'), 'utf8')).version;

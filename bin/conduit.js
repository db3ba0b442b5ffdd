#!/usr/bin/env node
// The `conduit` command: registers the TypeScript loader, then hands over to cli.ts.
import { register } from 'tsx/esm/api';

register();
const { main } = await import('./cli.ts');
process.exitCode = await main(process.argv.slice(2));

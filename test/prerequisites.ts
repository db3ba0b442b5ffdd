// `npm test`'s first step: the programs outside npm that the tests need (test/system-tools.ts).
// Missing ones are installed with apt-get when this runs as root on a machine that has it, as a
// fresh CI machine does; otherwise the run stops here, before any test, with one line naming
// the packages and the command that installs them.
import { spawnSync } from 'node:child_process';
import { findOnPath, SYSTEM_TOOLS } from './system-tools.ts';

function missingPackages(): string[] {
  return SYSTEM_TOOLS.filter((tool) => tool.executable() === null).map((tool) => tool.debianPackage);
}

function aptGet(args: string[]): boolean {
  const result = spawnSync('apt-get', args, {
    stdio: ['ignore', 'inherit', 'inherit'],
    env: { ...process.env, DEBIAN_FRONTEND: 'noninteractive' },
  });
  return result.status === 0;
}

function main(): number {
  let missing = missingPackages();
  if (missing.length === 0) return 0;
  const hasAptGet = findOnPath('apt-get') !== null;
  const isRoot = process.getuid?.() === 0;
  if (hasAptGet && isRoot) {
    console.error(`npm test: installing ${missing.join(' ')} with apt-get`);
    if (aptGet(['update', '-q']) && aptGet(['install', '-y', '-q', '--no-install-recommends', ...missing])) missing = missingPackages();
    if (missing.length === 0) return 0;
  }
  const install = `${hasAptGet && !isRoot ? 'sudo ' : ''}apt-get install ${missing.join(' ')}`;
  const names = missing.length === 1 ? missing[0] : `${missing.slice(0, -1).join(', ')} and ${missing.at(-1)}`;
  console.error(
    `npm test needs ${names}, not installed here: install ${missing.length === 1 ? 'it' : 'them'} with \`${install}\`` +
      `${hasAptGet ? '' : ' (Debian package names)'}${missing.includes('chromium') ? ', or set CHROMIUM_PATH to a Chromium' : ''}`,
  );
  return 1;
}

process.exitCode = main();

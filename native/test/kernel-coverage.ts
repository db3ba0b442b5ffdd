// Which kernel paths a CPU runs, and the CONDUIT_REQUIRE_KERNELS gate: a path the CPU lacks is a
// skipped test, never a silent absence, and a machine meant to cover a path fails the run when
// it did not.
import type { KernelPath } from '../api.ts';

export type KernelName = Exclude<KernelPath, 'auto'>;

export const KERNEL_NAMES: readonly KernelName[] = ['amx', 'avx512', 'avx2', 'scalar'];

export const REQUIRE_KERNELS_VARIABLE = 'CONDUIT_REQUIRE_KERNELS';

/**
 * The instruction-set extensions each path needs, as cd_kernel_supported (src/api.cc) asks
 * __builtin_cpu_supports, named as Linux's /proc/cpuinfo flags name them.
 */
const REQUIRED_CPU_FLAGS: Readonly<Record<KernelName, readonly string[]>> = {
  // and the OS's grant of the tile state, which no flag shows (Linux lists amx_* only when it can).
  amx: ['avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512vl', 'avx512_vnni', 'avx512_bf16', 'amx_tile', 'amx_bf16'],
  avx512: ['avx2', 'fma', 'f16c', 'avx512f', 'avx512bw', 'avx512vl', 'avx512_vnni', 'avx512_bf16'],
  avx2: ['avx2', 'fma', 'f16c'],
  scalar: [],
};

/** The paths a CPU with these flags runs, and for each other path the flags it lacks. */
export function kernelPathsOf(cpuFlags: ReadonlySet<string>): { runnable: KernelName[]; missingFlags: Partial<Record<KernelName, string[]>> } {
  const runnable: KernelName[] = [];
  const missingFlags: Partial<Record<KernelName, string[]>> = {};
  for (const kernel of KERNEL_NAMES) {
    const missing = REQUIRED_CPU_FLAGS[kernel].filter((flag) => !cpuFlags.has(flag));
    if (missing.length === 0) runnable.push(kernel);
    else missingFlags[kernel] = missing;
  }
  return { runnable, missingFlags };
}

/** The flags of the first processor in a /proc/cpuinfo text. */
export function cpuFlagsOf(cpuinfo: string): Set<string> {
  const line = cpuinfo.split('\n').find((l) => /^flags\s*:/.test(l));
  return new Set(line === undefined ? [] : line.slice(line.indexOf(':') + 1).trim().split(/\s+/));
}

/** The paths CONDUIT_REQUIRE_KERNELS names (comma-separated), none when unset; an unknown name throws. */
export function parseRequiredKernels(value: string | undefined): KernelName[] {
  if (value === undefined || value.trim() === '') return [];
  return value.split(',').map((name) => {
    const kernel = name.trim() as KernelName;
    if (!KERNEL_NAMES.includes(kernel)) {
      throw new Error(`${REQUIRE_KERNELS_VARIABLE}: unknown kernel path '${name.trim()}' (known: ${KERNEL_NAMES.join(', ')})`);
    }
    return kernel;
  });
}

/** The required paths that did not run, in the order they were required. */
export function missingRequiredKernels(required: readonly KernelName[], runnable: readonly KernelName[]): KernelName[] {
  return required.filter((kernel) => !runnable.includes(kernel));
}

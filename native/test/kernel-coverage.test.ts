// Kernel-path coverage: which paths a CPU runs follows from its flags as the runtime decides it,
// and CONDUIT_REQUIRE_KERNELS fails the run on a machine that skipped a path it was meant to run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readFileSync } from 'node:fs';
import { kernelSupported } from '../index.ts';
import {
  KERNEL_NAMES,
  REQUIRE_KERNELS_VARIABLE,
  cpuFlagsOf,
  kernelPathsOf,
  missingRequiredKernels,
  parseRequiredKernels,
} from './kernel-coverage.ts';

const AVX2_FLAGS = ['sse4_2', 'avx', 'avx2', 'fma', 'f16c', 'bmi2'];
const AVX512_NO_BF16_FLAGS = [...AVX2_FLAGS, 'avx512f', 'avx512bw', 'avx512vl', 'avx512dq', 'avx512_vnni'];
/** Each machine CI meets, by its /proc/cpuinfo flags. */
const CPUS = {
  'Intel Sapphire Rapids (AVX-512 with BF16, AMX)': new Set([...AVX512_NO_BF16_FLAGS, 'avx512_bf16', 'amx_tile', 'amx_bf16', 'amx_int8']),
  'AMD EPYC Genoa (AVX-512 with BF16, no AMX)': new Set([...AVX512_NO_BF16_FLAGS, 'avx512_bf16']),
  'Intel Cascade Lake / Ice Lake (AVX-512 and VNNI, no BF16)': new Set(AVX512_NO_BF16_FLAGS),
  'AMD EPYC Rome (AVX2 only)': new Set(AVX2_FLAGS),
  'an x86-64 without FMA': new Set(['sse4_2', 'avx', 'avx2', 'f16c']),
};

test('the paths a CPU runs follow from its flags, as the runtime decides them', () => {
  const runnable = (cpu: keyof typeof CPUS) => kernelPathsOf(CPUS[cpu]).runnable;
  assert.deepEqual(runnable('Intel Sapphire Rapids (AVX-512 with BF16, AMX)'), ['amx', 'avx512', 'avx2', 'scalar']);
  assert.deepEqual(runnable('AMD EPYC Genoa (AVX-512 with BF16, no AMX)'), ['avx512', 'avx2', 'scalar']);
  assert.deepEqual(kernelPathsOf(CPUS['AMD EPYC Genoa (AVX-512 with BF16, no AMX)']).missingFlags, { amx: ['amx_tile', 'amx_bf16'] });
  assert.deepEqual(runnable('Intel Cascade Lake / Ice Lake (AVX-512 and VNNI, no BF16)'), ['avx2', 'scalar']);
  assert.deepEqual(kernelPathsOf(CPUS['Intel Cascade Lake / Ice Lake (AVX-512 and VNNI, no BF16)']).missingFlags, {
    amx: ['avx512_bf16', 'amx_tile', 'amx_bf16'],
    avx512: ['avx512_bf16'],
  });
  assert.deepEqual(runnable('AMD EPYC Rome (AVX2 only)'), ['avx2', 'scalar']);
  assert.deepEqual(runnable('an x86-64 without FMA'), ['scalar']);
});

test('CONDUIT_REQUIRE_KERNELS fails a machine that skipped a required path and passes one that ran them all', () => {
  const required = parseRequiredKernels('avx512,avx2,scalar');
  assert.deepEqual(required, ['avx512', 'avx2', 'scalar']);
  assert.deepEqual(missingRequiredKernels(required, kernelPathsOf(CPUS['Intel Cascade Lake / Ice Lake (AVX-512 and VNNI, no BF16)']).runnable), ['avx512']);
  assert.deepEqual(missingRequiredKernels(required, kernelPathsOf(CPUS['Intel Sapphire Rapids (AVX-512 with BF16, AMX)']).runnable), []);
  assert.deepEqual(missingRequiredKernels(parseRequiredKernels('amx,avx512'), kernelPathsOf(CPUS['AMD EPYC Genoa (AVX-512 with BF16, no AMX)']).runnable), ['amx']);
  assert.deepEqual(missingRequiredKernels(parseRequiredKernels(' avx2 , scalar'), kernelPathsOf(CPUS['AMD EPYC Rome (AVX2 only)']).runnable), []);
  assert.deepEqual(parseRequiredKernels(undefined), []);
  assert.deepEqual(parseRequiredKernels(''), []);
  assert.throws(() => parseRequiredKernels('avx512,avx1'), /CONDUIT_REQUIRE_KERNELS: unknown kernel path 'avx1'/);
});

test('the flags /proc/cpuinfo lists give the paths the runtime reports for this CPU', { skip: !existsSync('/proc/cpuinfo') && 'no /proc/cpuinfo here' }, (t) => {
  const { runnable } = kernelPathsOf(cpuFlagsOf(readFileSync('/proc/cpuinfo', 'utf8')));
  t.diagnostic(`this CPU runs the kernel paths: ${runnable.join(', ')}`);
  assert.deepEqual(runnable, KERNEL_NAMES.filter((kernel) => kernelSupported(kernel)));
});

test(`every kernel path ${REQUIRE_KERNELS_VARIABLE} names runs on this machine`, () => {
  const required = parseRequiredKernels(process.env[REQUIRE_KERNELS_VARIABLE]);
  const missing = missingRequiredKernels(required, KERNEL_NAMES.filter((kernel) => kernelSupported(kernel)));
  assert.deepEqual(missing, [], `${REQUIRE_KERNELS_VARIABLE}=${process.env[REQUIRE_KERNELS_VARIABLE]}, but this CPU cannot run: ${missing.join(', ')}`);
});

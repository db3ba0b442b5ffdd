// A real gateway on 127.0.0.1:0 serving a model repository over KServe v2 (no LLMs), for tests
// that talk to it with fetch and the gRPC client.
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { FastifyInstance } from 'fastify';
import { CONFIG_DATATYPE_NAMES } from './datatypes.ts';

export { serializeBytes } from './datatypes.ts';
import { ModelRepository, type ModelControlMode } from '../../../triton/index.ts';
import { createGateway, type GatewayOptions } from '../../server.ts';
import type { KServeControl } from '../control.ts';

export const MODELS_DIR = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../../models');
export const BODY_LIMIT_BYTES = 1 << 20;

export interface KServeTestServer {
  baseUrl: string;
  repository: ModelRepository;
  close(): Promise<void>;
}

export interface KServeServerExtras {
  /** Shared with a gRPC service the test starts; the plugin's own when omitted. */
  control?: KServeControl;
  logger?: GatewayOptions['logger'];
}

export async function startKServeServer(
  repoDir: string, mode: ModelControlMode = 'none', startupModels: string[] = [], extras: KServeServerExtras = {},
): Promise<KServeTestServer> {
  const repository = new ModelRepository({ repoDir, mode, pollIntervalMs: 100, startupModels });
  await repository.start();
  const gateway: FastifyInstance = await createGateway({
    models: [], bodyLimitBytes: BODY_LIMIT_BYTES, logger: extras.logger, classic: { repository, version: '0.1.0', control: extras.control },
  });
  const baseUrl = await gateway.listen({ host: '127.0.0.1', port: 0 });
  return {
    baseUrl,
    repository,
    async close() {
      await gateway.close();
      await repository.close();
    },
  };
}

const IDENTITY_TS = 'export function execute(inputs) { return { OUTPUT: inputs.INPUT }; }\n';

/** A temporary repository with `identity_<datatype>` (one per datatype: OUTPUT = INPUT, dims [-1]) and more. */
export function makeTestRepo(extra: Record<string, { config: string; script?: string }> = {}): { dir: string; remove(): void } {
  const dir = mkdtempSync(path.join(os.tmpdir(), 'conduit-kserve-'));
  const models: Record<string, { config: string; script?: string }> = { ...extra };
  for (const [datatype, configType] of Object.entries(CONFIG_DATATYPE_NAMES)) {
    models[`identity_${datatype.toLowerCase()}`] = {
      config: `backend: "script"\nmax_batch_size: 0\ninput [ { name: "INPUT" data_type: ${configType} dims: [ -1 ] } ]\noutput [ { name: "OUTPUT" data_type: ${configType} dims: [ -1 ] } ]\n`,
      script: IDENTITY_TS,
    };
  }
  for (const [name, model] of Object.entries(models)) {
    mkdirSync(path.join(dir, name, '1'), { recursive: true });
    writeFileSync(path.join(dir, name, 'config.pbtxt'), model.config);
    if (model.script !== undefined) writeFileSync(path.join(dir, name, '1', 'model.ts'), model.script);
  }
  return { dir, remove: () => rmSync(dir, { recursive: true, force: true }) };
}

/** The binary extension's body: JSON header, then each tensor's bytes. */
export function binaryBody(header: unknown, tensors: Uint8Array[]): { body: Buffer; headerLength: number } {
  const json = Buffer.from(JSON.stringify(header));
  return { body: Buffer.concat([json, ...tensors]), headerLength: json.byteLength };
}

/** Splits a binary response into its JSON header and the bytes after it. */
export async function readBinaryResponse(response: Response): Promise<{ json: any; binary: Buffer }> {
  const body = Buffer.from(await response.arrayBuffer());
  const headerLength = response.headers.get('inference-header-content-length');
  const jsonLength = headerLength === null ? body.byteLength : Number(headerLength);
  return { json: JSON.parse(body.subarray(0, jsonLength).toString('utf8')), binary: body.subarray(jsonLength) };
}

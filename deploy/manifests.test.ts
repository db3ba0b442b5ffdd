// The Kubernetes manifests, checked offline: every object against the Kubernetes OpenAPI schema
// (kubernetes-models), and the references between them and into Conduit against what they name:
// Service selectors and probe ports, the autoscaler's target, the gateway's configuration (our
// own schema) and the worker's command line (our own flag parser), and the Redis address.
import assert from 'node:assert/strict';
import { readdirSync, readFileSync } from 'node:fs';
import path from 'node:path';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { parseAllDocuments, parse as parseYaml } from 'yaml';
import { validateConfig } from '../configs/schema.ts';
import { parseWorkerArgs } from '../bin/worker-flags.ts';

const deployDir = path.dirname(fileURLToPath(import.meta.url));
const repoRoot = path.resolve(deployDir, '..');
const manifestDir = path.join(deployDir, 'kubernetes');
/** Where the Dockerfile puts the repository in the image. */
const IMAGE_APP_DIR = '/app';

interface Manifest {
  file: string;
  apiVersion: string;
  kind: string;
  metadata: { name: string; labels?: Record<string, string> };
  spec?: any;
  data?: Record<string, string>;
}

const manifests: Manifest[] = readdirSync(manifestDir)
  .filter((file) => file.endsWith('.yaml'))
  .flatMap((file) =>
    parseAllDocuments(readFileSync(path.join(manifestDir, file), 'utf8')).map((document) => {
      assert.deepEqual(document.errors, [], `${file}: YAML errors`);
      return { file, ...(document.toJS() as Omit<Manifest, 'file'>) };
    }),
  );

function find(kind: string, name: string): Manifest {
  const manifest = manifests.find((candidate) => candidate.kind === kind && candidate.metadata.name === name);
  assert.ok(manifest, `no ${kind} ${name} among the manifests`);
  return manifest;
}

function containersOf(manifest: Manifest): any[] {
  return manifest.spec.template.spec.containers;
}

test('every object is valid against the Kubernetes schema of its apiVersion and kind', async () => {
  assert.ok(manifests.length >= 8, `only ${manifests.length} objects`);
  for (const { file, ...object } of manifests) {
    // kubernetes-models lays its classes out as <group>/<version>/<Kind> (core: v1/<Kind>).
    const module = await import(`kubernetes-models/${object.apiVersion}/${object.kind}`);
    const Model = module[object.kind];
    assert.doesNotThrow(() => new Model(object).validate(), `${file}: ${object.kind} ${object.metadata.name}`);
  }
});

test('the schema check refuses what kubectl would', async () => {
  const { Deployment } = await import('kubernetes-models/apps/v1/Deployment');
  const gateway = structuredClone(find('Deployment', 'conduit-gateway'));
  delete (gateway as Partial<Manifest>).file;
  gateway.spec.template.spec.containers[0].ports[0].containerPort = '8000';
  assert.throws(() => new Deployment(gateway).validate(), /containerPort must be integer/);
});

test('each Service and disruption budget selects the pods of a Deployment, on ports its containers name', () => {
  for (const selecting of manifests.filter((manifest) => manifest.kind === 'Service' || manifest.kind === 'PodDisruptionBudget')) {
    const selector: Record<string, string> = selecting.kind === 'Service' ? selecting.spec.selector : selecting.spec.selector.matchLabels;
    const targets = manifests.filter(
      (manifest) =>
        manifest.kind === 'Deployment' &&
        Object.entries(selector).every(([key, value]) => manifest.spec.template.metadata.labels[key] === value),
    );
    assert.equal(targets.length, 1, `${selecting.kind} ${selecting.metadata.name} selects ${targets.length} Deployments`);
    if (selecting.kind !== 'Service') continue;
    const portNames = new Set(containersOf(targets[0]).flatMap((container) => container.ports.map((port: { name: string }) => port.name)));
    for (const port of selecting.spec.ports) assert.ok(portNames.has(port.targetPort), `${selecting.metadata.name}: no container port ${port.targetPort}`);
  }
  for (const deployment of manifests.filter((manifest) => manifest.kind === 'Deployment')) {
    assert.deepEqual(
      Object.entries(deployment.spec.selector.matchLabels).filter(([key, value]) => deployment.spec.template.metadata.labels[key] !== value),
      [],
      `${deployment.metadata.name}: its selector must match its own pods`,
    );
    for (const container of containersOf(deployment)) {
      const portNames = new Set(container.ports.map((port: { name: string }) => port.name));
      for (const probe of ['startupProbe', 'readinessProbe', 'livenessProbe']) {
        const port = container[probe]?.httpGet?.port ?? container[probe]?.tcpSocket?.port;
        if (port !== undefined) assert.ok(portNames.has(port), `${deployment.metadata.name} ${probe}: no port ${port}`);
      }
      assert.ok(container.readinessProbe && container.livenessProbe, `${deployment.metadata.name}: readiness and liveness probes`);
      assert.ok(container.resources?.requests?.cpu && container.resources?.requests?.memory, `${deployment.metadata.name}: resource requests`);
    }
  }
});

test('the autoscaler scales the workers on the queue metric the gateways export', () => {
  const autoscaler = find('HorizontalPodAutoscaler', 'conduit-worker');
  const target = autoscaler.spec.scaleTargetRef;
  find(target.kind, target.name);
  const [metric] = autoscaler.spec.metrics;
  assert.equal(metric.external.metric.name, 'conduit_num_requests_waiting');
  assert.match(readFileSync(path.join(repoRoot, 'gateway', 'metrics.ts'), 'utf8'), /'conduit_num_requests_waiting'/);
});

test("the gateway's configuration passes Conduit's schema, names a model the image holds, and finds Redis at its Service", () => {
  const gateway = find('Deployment', 'conduit-gateway');
  const [container] = containersOf(gateway);
  const configFile = container.args[container.args.indexOf('--config') + 1];
  const mount = container.volumeMounts.find((volumeMount: { mountPath: string }) => configFile.startsWith(`${volumeMount.mountPath}/`));
  const volume = gateway.spec.template.spec.volumes.find((candidate: { name: string }) => candidate.name === mount.name);
  const configMap = find('ConfigMap', volume.configMap.name);
  const config = validateConfig(parseYaml(configMap.data![path.basename(configFile)]), configFile);
  for (const model of config.models) {
    assert.ok(model.path.startsWith(`${IMAGE_APP_DIR}/`), `${model.path} is not in the image`);
    readFileSync(path.join(repoRoot, path.relative(IMAGE_APP_DIR, model.path), 'config.json'));
  }
  const redisUrl = new URL(config.router.redis_url!);
  const redisService = find('Service', redisUrl.hostname);
  assert.ok(redisService.spec.ports.some((port: { port: number }) => port.port === Number(redisUrl.port)));
  const servicePorts = find('Service', 'conduit').spec.ports.map((port: { port: number }) => port.port);
  assert.deepEqual(servicePorts, [config.server.http_port, config.server.grpc_port, config.server.metrics_port]);
});

test("the worker's command line parses with Conduit's own flags, advertising its pod address", () => {
  const [container] = containersOf(find('Deployment', 'conduit-worker'));
  assert.equal(container.args[0], 'worker');
  assert.ok(container.env.some((variable: { name: string }) => variable.name === 'POD_IP'));
  // Kubernetes expands $(POD_IP) in args from the container's environment.
  const settings = parseWorkerArgs(container.args.slice(1).map((arg: string) => arg.replace('$(POD_IP)', '10.1.2.3')));
  assert.equal(settings.sharedState?.advertiseAddress, '10.1.2.3:7000');
  assert.equal(new URL(settings.sharedState!.redisUrl).hostname, 'conduit-redis');
  const [listenHost, listenPort] = settings.listen.split(':');
  assert.equal(listenHost, '0.0.0.0');
  assert.equal(Number(listenPort), container.ports[0].containerPort);
  assert.equal(settings.numThreads, Number(container.resources.requests.cpu), 'one thread per requested core');
});

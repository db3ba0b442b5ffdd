// What of JSON Schema a structured output can honour, checked before anything compiles: the
// grammar engine (xgrammar) silently ignores keywords it does not enforce, so a schema using one
// would yield output that fails its own schema. Each such keyword is refused by name and place
// (vLLM's top complaint is a `response_format` quietly ignored). Keywords it enforces only
// approximately are rewritten into ones it enforces exactly:
//   - `format` date, time, date-time, ipv4, email and hostname become a `pattern` (xgrammar's own
//     accept 1959-06-31, 10:01:60 and 01.2.3.4, which validators reject);
//   - `minLength` / `maxLength` become a pattern of plain characters (xgrammar's length-bounded
//     strings let raw control characters through, which is not JSON).
//   - `minimum` / `maximum` / `exclusiveMinimum` / `exclusiveMaximum` become a grammar of the
//     range's digits (number-range.ts; xgrammar's ranges let 10.62 under maximum 10).
// The rewritten patterns allow a subset of what the format or length allows: every output stays
// valid, some valid strings (escapes, leap seconds) are never produced.
import type { EngineError } from '../errors.ts';
import { rangeMarker, scaledRange, type NumericBounds } from './number-range.ts';

/** Validation keywords the grammar cannot enforce. */
const UNSUPPORTED = new Set([
  'not', 'if', 'then', 'else', 'dependentRequired', 'dependentSchemas', 'dependencies', 'multipleOf', 'contains',
  'minContains', 'maxContains', 'unevaluatedItems', '$dynamicRef', '$recursiveRef', '$recursiveAnchor',
]);

const NUMERIC_BOUNDS = ['minimum', 'maximum', 'exclusiveMinimum', 'exclusiveMaximum'] as const;

/** Formats xgrammar enforces exactly as validators (ajv-formats, full mode) check them. */
const NATIVE_FORMATS = new Set(['uuid', 'ipv6', 'duration']);

const OCTET = '(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])';
const LABEL = '[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?';
const DATE = '[0-9]{4}-(?:(?:0[1-9]|1[0-2])-(?:0[1-9]|1[0-9]|2[0-8])|(?:0[13-9]|1[0-2])-(?:29|30)|(?:0[13578]|1[02])-31)';
const TIME = '(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])';

/**
 * Formats rewritten as patterns. xgrammar's regexes have no lookahead, so a date is written out
 * month by month: 29 February in every year (validators accept it only in leap years) is left
 * out, as are 30 and 31 where a month lacks them.
 */
const FORMAT_PATTERNS: Record<string, string> = {
  date: `^${DATE}$`,
  time: `^${TIME}$`,
  'date-time': `^${DATE}T${TIME}$`,
  ipv4: `^${OCTET}\\.${OCTET}\\.${OCTET}\\.${OCTET}$`,
  email: `^[a-zA-Z0-9_+-]+(?:\\.[a-zA-Z0-9_+-]+)*@(?:${LABEL}\\.)+${LABEL}$`,
  hostname: `^${LABEL}(?:\\.${LABEL})*$`,
};

class Unsupported extends Error {}

type Schema = boolean | Record<string, unknown>;

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === 'object' && value !== null && !Array.isArray(value);
}

function pointer(path: readonly string[]): string {
  return `#${path.map((part) => `/${part.replace(/~/g, '~0').replace(/\//g, '~1')}`).join('')}`;
}

function refuse(message: string, path: readonly string[]): never {
  throw new Unsupported(`${message} (at ${pointer(path)})`);
}

function typesOf(node: Record<string, unknown>): Set<string> | null {
  if (typeof node.type === 'string') return new Set([node.type]);
  if (Array.isArray(node.type)) return new Set(node.type.filter((type): type is string => typeof type === 'string'));
  const values = 'const' in node ? [node.const] : Array.isArray(node.enum) ? node.enum : null;
  if (values === null) return null;
  return new Set(values.map((value) => (value === null ? 'null' : Array.isArray(value) ? 'array' : Number.isInteger(value) ? 'integer' : typeof value)));
}

/** Whether two branches' types can share a value (integer values are numbers too). */
function typesOverlap(a: Set<string>, b: Set<string>): boolean {
  const widen = (types: Set<string>) => (types.has('integer') ? new Set([...types, 'number']) : types);
  const wideB = widen(b);
  return [...widen(a)].some((type) => wideB.has(type));
}

/** Values a branch's property is pinned to (const or enum), or null when unpinned. */
function pinnedValues(node: Record<string, unknown>, property: string): string[] | null {
  const properties = node.properties;
  if (!isObject(properties) || !isObject(properties[property])) return null;
  const required = Array.isArray(node.required) ? node.required : [];
  if (!required.includes(property)) return null;
  const schema = properties[property];
  if ('const' in schema) return [JSON.stringify(schema.const)];
  return Array.isArray(schema.enum) ? schema.enum.map((value) => JSON.stringify(value)) : null;
}

/**
 * oneOf needs exactly one branch to match; the grammar enforces at least one. That is the same
 * when no value can match two branches: their types are disjoint, or they are objects told apart
 * by a required property pinned to different values (a discriminated union).
 */
function oneOfIsDisjoint(branches: unknown[]): boolean {
  const objects = branches.filter(isObject);
  if (objects.length !== branches.length) return false;
  const types = objects.map(typesOf);
  if (types.every((set) => set !== null)) {
    const disjoint = types.every((a, i) => types.every((b, j) => j <= i || !typesOverlap(a!, b!)));
    if (disjoint) return true;
  }
  const first = objects[0];
  const candidates = isObject(first.properties) ? Object.keys(first.properties) : [];
  return candidates.some((property) => {
    const seen = new Set<string>();
    for (const branch of objects) {
      const values = pinnedValues(branch, property);
      if (values === null || values.some((value) => seen.has(value))) return false;
      for (const value of values) seen.add(value);
    }
    return true;
  });
}

function checkRange(node: Record<string, unknown>, low: string, high: string, path: readonly string[]): void {
  const min = node[low];
  const max = node[high];
  if (typeof min === 'number' && typeof max === 'number' && min > max) refuse(`${low} ${min} exceeds ${high} ${max}: nothing can match`, path);
}

/** Checks one schema node in place and rewrites its approximate keywords; recurses into subschemas. */
function prepareNode(schema: Schema, path: string[]): Schema {
  if (typeof schema === 'boolean') return schema;
  if (!isObject(schema)) refuse('a schema must be an object or a boolean', path);
  const node: Record<string, unknown> = { ...schema };
  const types = typesOf(node);
  for (const keyword of Object.keys(node)) {
    if (UNSUPPORTED.has(keyword)) refuse(`The JSON schema keyword "${keyword}" is not supported`, path);
  }
  if (node.uniqueItems === true) refuse('The JSON schema keyword "uniqueItems" is not supported', path);
  if (node.unevaluatedProperties !== undefined && node.unevaluatedProperties !== false) {
    refuse('The JSON schema keyword "unevaluatedProperties" is supported only as false', path);
  }
  checkRange(node, 'minLength', 'maxLength', path);
  checkRange(node, 'minItems', 'maxItems', path);
  checkRange(node, 'minProperties', 'maxProperties', path);
  if (typeof node.$ref === 'string' && !node.$ref.startsWith('#')) {
    refuse(`The JSON schema keyword "$ref" is supported within the schema only, not to "${node.$ref}"`, path);
  }
  if (Array.isArray(node.allOf) && node.allOf.length > 1) refuse('The JSON schema keyword "allOf" is supported with one schema only', path);
  if (Array.isArray(node.oneOf) && !oneOfIsDisjoint(node.oneOf)) {
    refuse('The JSON schema keyword "oneOf" is supported only when no value can match two of its schemas (use anyOf)', path);
  }
  prepareString(node, path);
  checkObjectBounds(node, path);
  for (const keyword of ['properties', 'patternProperties', '$defs', 'definitions']) {
    const children = node[keyword];
    if (!isObject(children)) continue;
    node[keyword] = Object.fromEntries(Object.entries(children).map(([name, child]) => [name, prepareNode(child as Schema, [...path, keyword, name])]));
  }
  for (const keyword of ['additionalProperties', 'items', 'propertyNames']) {
    const child = node[keyword];
    if (child !== undefined && !Array.isArray(child)) node[keyword] = prepareNode(child as Schema, [...path, keyword]);
  }
  for (const keyword of ['prefixItems', 'anyOf', 'oneOf', 'allOf']) {
    const children = node[keyword];
    if (Array.isArray(children)) node[keyword] = children.map((child, i) => prepareNode(child as Schema, [...path, keyword, String(i)]));
  }
  return NUMERIC_BOUNDS.some((bound) => node[bound] !== undefined) ? prepareBoundedNumber(node, types, path) : node;
}

/**
 * A number or integer with bounds becomes a marker that the grammar thread replaces with a grammar
 * of the range's digits (number-range.ts); beside other types, one branch of an anyOf.
 */
function prepareBoundedNumber(node: Record<string, unknown>, types: Set<string> | null, path: readonly string[]): Schema {
  const bounds: NumericBounds = {};
  for (const bound of NUMERIC_BOUNDS) {
    const value = node[bound];
    if (value === undefined) continue;
    if (typeof value !== 'number' || !Number.isFinite(value)) refuse(`"${bound}" must be a number`, path);
    bounds[bound] = value;
    delete node[bound];
  }
  if (types === null || !(types.has('number') || types.has('integer'))) {
    refuse('The JSON schema keywords "minimum", "maximum", "exclusiveMinimum" and "exclusiveMaximum" are supported with "type" number or integer', path);
  }
  for (const keyword of ['enum', 'const', 'anyOf', 'oneOf', 'allOf', '$ref']) {
    if (keyword in node) refuse(`Numeric bounds are not supported together with "${keyword}"`, path);
  }
  const range = scaledRange(bounds, !types.has('number'));
  if (typeof range === 'string') refuse(`The numeric bounds cannot be honoured: ${range}`, path);
  const marker = { const: rangeMarker(range) };
  const others = [...types].filter((type) => type !== 'number' && type !== 'integer');
  if (others.length === 0) return marker;
  return { anyOf: [marker, { ...node, type: others }] };
}

function prepareString(node: Record<string, unknown>, path: readonly string[]): void {
  const { format, pattern, minLength, maxLength } = node;
  const bounded = minLength !== undefined || maxLength !== undefined;
  if (format !== undefined) {
    if (typeof format !== 'string') refuse('"format" must be a string', path);
    if (bounded || pattern !== undefined) refuse(`The JSON schema keyword "format" is not supported together with ${bounded ? 'a length' : '"pattern"'}`, path);
    if (NATIVE_FORMATS.has(format)) return;
    const formatPattern = FORMAT_PATTERNS[format];
    if (formatPattern === undefined) refuse(`The string format "${format}" is not supported`, path);
    delete node.format;
    node.pattern = formatPattern;
    return;
  }
  if (!bounded) return;
  if (pattern !== undefined) refuse('The JSON schema keywords "minLength" and "maxLength" are not supported together with "pattern"', path);
  const min = typeof minLength === 'number' ? minLength : 0;
  delete node.minLength;
  delete node.maxLength;
  node.pattern = `^${lengthPattern(min, typeof maxLength === 'number' ? maxLength : null)}$`;
}

/** A string's plain character: no quote, no backslash, no control character. */
const PLAIN_CHAR = '[^"\\\\\\u0000-\\u001f]';
/** The longest bound written as one alternative per length; a longer one stays a counted repetition. */
const MAX_ENUMERATED_LENGTH = 16;

/**
 * Between min and max plain characters (no max: at least min). xgrammar 0.1.27 cannot settle a
 * counted repetition's tokens when it compiles, so within such a string every mask checks them at
 * run time: 1-20 ms a mask against ~0.03 ms elsewhere, which at batch 32 took more than a tenth
 * of decoding's speed. One alternative per length (`C{1}|C{2}|...`, the same language, the same
 * masks) is settled at compile time; its compile grows steeply with the bound (max 16: 0.13 s,
 * as fast as the repetition's; max 64: 13 s), so only short bounds are written that way.
 */
function lengthPattern(min: number, max: number | null): string {
  if (max === null || max > MAX_ENUMERATED_LENGTH) return `${PLAIN_CHAR}{${min},${max ?? ''}}`;
  if (max === 0) return '';
  const lengths = Array.from({ length: max - Math.max(min, 1) + 1 }, (_, i) => `${PLAIN_CHAR}{${Math.max(min, 1) + i}}`);
  return `(?:${lengths.join('|')})${min === 0 ? '?' : ''}`;
}

/** An object that must have more properties than it may have is refused (xgrammar aborts on it). */
function checkObjectBounds(node: Record<string, unknown>, path: readonly string[]): void {
  const closed = node.additionalProperties === false && node.patternProperties === undefined;
  if (!closed) return;
  const properties = isObject(node.properties) ? Object.keys(node.properties) : [];
  if (typeof node.minProperties === 'number' && node.minProperties > properties.length) {
    refuse(`minProperties ${node.minProperties} exceeds the ${properties.length} properties the schema allows`, path);
  }
  const required = Array.isArray(node.required) ? node.required : [];
  const missing = required.find((name) => typeof name === 'string' && !properties.includes(name));
  if (missing !== undefined) refuse(`the required property "${missing}" is not among the properties the schema allows`, path);
}

/**
 * The schema xgrammar compiles (JSON text), or an `invalid_request` that names the first keyword
 * it could not honour and where. Annotations and keywords JSON Schema does not define are left
 * alone, as a validator leaves them.
 */
export function prepareJsonSchema(schemaText: string): { schema: string } | EngineError {
  let schema: unknown;
  try {
    schema = JSON.parse(schemaText);
  } catch (err) {
    return { code: 'invalid_request', message: `The JSON schema is not JSON: ${(err as Error).message}` };
  }
  const prepared = prepareSchemaValue(schema);
  return 'code' in prepared ? prepared : { schema: JSON.stringify(prepared.schema) };
}

/** prepareJsonSchema for a schema already parsed (one inside a structural tag). */
export function prepareSchemaValue(schema: unknown): { schema: unknown } | EngineError {
  if (typeof schema !== 'boolean' && !isObject(schema)) return { code: 'invalid_request', message: 'The JSON schema must be an object' };
  try {
    return { schema: prepareNode(schema, []) };
  } catch (err) {
    if (err instanceof Unsupported) return { code: 'invalid_request', message: err.message };
    throw err;
  }
}

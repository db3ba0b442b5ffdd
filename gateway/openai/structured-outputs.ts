// What a request asks its output to match, as the engine takes it (engine/types.ts
// StructuredConstraint): OpenAI's response_format (chat, completions) and text.format (Responses),
// and vLLM's structured_outputs extension (json, regex, choice, grammar, json_object,
// structural_tag). Schemas are checked here as JSON Schema (ajv, draft 2020-12): a schema that is
// not one is a 400 naming the field; strict: true adds OpenAI's strict rules (every object closed
// with additionalProperties: false, every property required). Whether the grammar engine can
// honour each keyword is the engine's to say (engine/grammar/json-schema.ts): it refuses one it
// cannot by name, before any token, which reaches the client as a 400 too.
import { Ajv2020 } from 'ajv/dist/2020.js';
import { z } from 'zod';
import type { StructuredConstraint } from '../../engine/types.ts';
import { ApiError } from '../errors.ts';

const NAME = /^[a-zA-Z0-9_-]{1,64}$/;
const jsonObject = z.record(z.string(), z.unknown());

export const jsonSchemaFormat = z.object({
  name: z.string().regex(NAME, 'expected a name of letters, digits, _ and -, at most 64 characters'),
  description: z.string().nullish(),
  schema: jsonObject.nullish(),
  strict: z.boolean().nullish(),
});

export const responseFormatSchema = z.discriminatedUnion(
  'type',
  [z.object({ type: z.literal('text') }), z.object({ type: z.literal('json_object') }), z.object({ type: z.literal('json_schema'), json_schema: jsonSchemaFormat })],
  { error: 'expected a response_format of type text, json_object or json_schema' },
);

/** vLLM's extension: exactly one of these. */
export const structuredOutputsSchema = z.object({
  json: z.union([jsonObject, z.string()]).nullish(),
  json_object: z.boolean().nullish(),
  regex: z.string().min(1).nullish(),
  choice: z.array(z.string().min(1)).min(1).nullish(),
  grammar: z.string().min(1).nullish(),
  structural_tag: z.union([jsonObject, z.string()]).nullish(),
});

export type ResponseFormat = z.infer<typeof responseFormatSchema>;
export type StructuredOutputsRequest = z.infer<typeof structuredOutputsSchema>;
export type JsonSchemaFormat = z.infer<typeof jsonSchemaFormat>;

const ajv = new Ajv2020({ strict: false, validateFormats: false, allErrors: false });

/**
 * A 400 unless schema is a JSON Schema; with strict, unless it also keeps OpenAI's strict rules.
 * what names it in messages ("response_format 'person'"), param points at it. The schema is checked
 * against the draft 2020-12 meta-schema, not compiled into a validator the gateway would never run;
 * the two things only a compile would find, a $ref that points nowhere and a pattern that is no
 * regular expression, are checked here by walking the schema. ajv.compile finds both too, but:
 * - its errors do not say where ("can't resolve reference #/$defs/x from id #", "Invalid regular
 *   expression: /(a/u: Unterminated group"), and these messages name the subschema;
 * - it costs the event loop 1.6-6.5 ms of CPU a new schema (validateSchema 0.07-0.1 ms), every
 *   request's schema being a new object;
 * - ajv keeps every schema it compiled (its cache) until removed, and its docs treat compiled
 *   schemas as trusted code, which a request's are not.
 */
export function checkJsonSchema(schema: unknown, strict: boolean, what: string, param: string): void {
  if (typeof schema !== 'object' || schema === null || Array.isArray(schema)) {
    throw new ApiError('invalid_request', `Invalid schema for ${what}: a schema must be a JSON object.`, param);
  }
  // Validated as draft 2020-12 whatever it says it is: the grammar reads the keywords, not the dialect.
  const { $schema: _dialect, ...body } = schema as Record<string, unknown>;
  if (!ajv.validateSchema(body)) {
    throw new ApiError('invalid_request', `Invalid schema for ${what}: schema is invalid: ${ajv.errorsText(ajv.errors)}.`, param);
  }
  const problem = unresolvable(body, body, []);
  if (problem !== null) throw new ApiError('invalid_request', `Invalid schema for ${what}: ${problem}.`, param);
  if (strict) checkStrict(body, [], what, param);
}

/** Keywords whose value is a subschema, a map of them, or an array of them. */
const SUBSCHEMA = ['additionalProperties', 'items', 'propertyNames', 'not', 'if', 'then', 'else', 'contains', 'unevaluatedItems', 'unevaluatedProperties'];
const SUBSCHEMA_MAPS = ['properties', 'patternProperties', '$defs', 'definitions', 'dependentSchemas'];
const SUBSCHEMA_ARRAYS = ['prefixItems', 'anyOf', 'oneOf', 'allOf'];

function hasAnchor(node: unknown, anchor: string): boolean {
  if (typeof node !== 'object' || node === null) return false;
  if ((node as Record<string, unknown>).$anchor === anchor) return true;
  return Object.values(node).some((child) => hasAnchor(child, anchor));
}

/** Whether a reference within the schema (a JSON pointer or an anchor) finds its target. */
function resolves(root: Record<string, unknown>, ref: string): boolean {
  // Others, to other documents, are the engine's to refuse by name.
  if (!ref.startsWith('#') || ref === '#') return true;
  if (!ref.startsWith('#/')) return hasAnchor(root, decodeURIComponent(ref.slice(1)));
  let node: unknown = root;
  for (const part of ref.slice(2).split('/')) {
    const key = decodeURIComponent(part).replace(/~1/g, '/').replace(/~0/g, '~');
    if (typeof node !== 'object' || node === null || !Object.hasOwn(node, key)) return false;
    node = (node as Record<string, unknown>)[key];
  }
  return true;
}

function validPattern(pattern: string): boolean {
  try {
    new RegExp(pattern, 'u');
    return true;
  } catch {
    return false;
  }
}

function pointer(path: readonly string[]): string {
  return `#${path.map((part) => `/${part.replace(/~/g, '~0').replace(/\//g, '~1')}`).join('')}`;
}

/** What a compile would refuse in the schema at path (a dangling $ref, a broken pattern), or null. */
function unresolvable(node: unknown, root: Record<string, unknown>, path: string[]): string | null {
  if (typeof node !== 'object' || node === null || Array.isArray(node)) return null;
  const schema = node as Record<string, unknown>;
  const at = pointer(path);
  if (typeof schema.$ref === 'string' && !resolves(root, schema.$ref)) return `can't resolve reference ${schema.$ref} from ${at}`;
  if (typeof schema.pattern === 'string' && !validPattern(schema.pattern)) return `pattern ${JSON.stringify(schema.pattern)} at ${at} is not a regular expression`;
  for (const keyword of SUBSCHEMA) {
    const problem = unresolvable(schema[keyword], root, [...path, keyword]);
    if (problem !== null) return problem;
  }
  for (const keyword of SUBSCHEMA_MAPS) {
    const children = schema[keyword];
    if (typeof children !== 'object' || children === null) continue;
    for (const [name, child] of Object.entries(children)) {
      if (keyword === 'patternProperties' && !validPattern(name)) return `pattern ${JSON.stringify(name)} at ${pointer([...path, keyword])} is not a regular expression`;
      const problem = unresolvable(child, root, [...path, keyword, name]);
      if (problem !== null) return problem;
    }
  }
  for (const keyword of SUBSCHEMA_ARRAYS) {
    const children = schema[keyword];
    if (!Array.isArray(children)) continue;
    for (const [i, child] of children.entries()) {
      const problem = unresolvable(child, root, [...path, keyword, String(i)]);
      if (problem !== null) return problem;
    }
  }
  return null;
}

/** OpenAI's strict mode: every object lists all its properties as required and allows no others. */
function checkStrict(node: unknown, context: string[], what: string, param: string): void {
  if (typeof node !== 'object' || node === null) return;
  if (Array.isArray(node)) {
    node.forEach((child, i) => checkStrict(child, [...context, String(i)], what, param));
    return;
  }
  const schema = node as Record<string, unknown>;
  const where = `In context=(${context.map((part) => `'${part}'`).join(', ')})`;
  const isObject = schema.type === 'object' || (Array.isArray(schema.type) && schema.type.includes('object')) || typeof schema.properties === 'object';
  if (isObject) {
    if (schema.additionalProperties !== false) {
      throw new ApiError('invalid_request', `Invalid schema for ${what}: ${where}, 'additionalProperties' is required to be supplied and to be false.`, param);
    }
    const properties = Object.keys((schema.properties as object | undefined) ?? {});
    const required = new Set(Array.isArray(schema.required) ? schema.required : []);
    const missing = properties.find((name) => !required.has(name));
    if (missing !== undefined) {
      throw new ApiError(
        'invalid_request',
        `Invalid schema for ${what}: ${where}, 'required' is required to be supplied and to be an array including every key in properties. Missing '${missing}'.`,
        param,
      );
    }
  }
  for (const [key, child] of Object.entries(schema)) {
    if (['properties', '$defs', 'definitions', 'patternProperties'].includes(key) && typeof child === 'object' && child !== null) {
      for (const [name, sub] of Object.entries(child)) checkStrict(sub, [...context, key, name], what, param);
    } else if (['items', 'additionalProperties', 'anyOf', 'oneOf', 'allOf', 'prefixItems', 'not'].includes(key)) {
      checkStrict(child, [...context, key], what, param);
    }
  }
}

/** A json_schema format's constraint: the schema checked (and, strict, held to OpenAI's rules). */
export function jsonSchemaConstraint(format: JsonSchemaFormat, what: string, param: string): StructuredConstraint {
  const schema = format.schema ?? {};
  checkJsonSchema(schema, format.strict === true, `${what} '${format.name}'`, param);
  return { kind: 'json_schema', schema: JSON.stringify(schema) };
}

/** response_format as a constraint; null for text. */
function responseFormatConstraint(format: ResponseFormat | null | undefined, param = 'response_format'): StructuredConstraint | null {
  if (format == null || format.type === 'text') return null;
  if (format.type === 'json_object') return { kind: 'json_object' };
  return jsonSchemaConstraint(format.json_schema, 'response_format', `${param}.json_schema.schema`);
}

/** vLLM's structured_outputs as a constraint: exactly one kind. */
function structuredOutputsConstraint(request: StructuredOutputsRequest, param = 'structured_outputs'): StructuredConstraint {
  const kinds = (['json', 'json_object', 'regex', 'choice', 'grammar', 'structural_tag'] as const).filter((kind) => request[kind] != null && request[kind] !== false);
  if (kinds.length !== 1) {
    throw new ApiError('invalid_request', `structured_outputs takes exactly one of json, json_object, regex, choice, grammar or structural_tag; got ${kinds.length === 0 ? 'none' : kinds.join(', ')}.`, param);
  }
  switch (kinds[0]) {
    case 'json': {
      let schema: unknown = request.json;
      if (typeof schema === 'string') {
        try {
          schema = JSON.parse(schema);
        } catch {
          throw new ApiError('invalid_request', 'structured_outputs.json must be a JSON schema (an object, or its JSON text).', `${param}.json`);
        }
      }
      checkJsonSchema(schema, false, 'structured_outputs.json', `${param}.json`);
      return { kind: 'json_schema', schema: JSON.stringify(schema) };
    }
    case 'json_object':
      return { kind: 'json_object' };
    case 'regex':
      return { kind: 'regex', pattern: request.regex! };
    case 'choice':
      return { kind: 'choice', choices: request.choice! };
    case 'grammar':
      return { kind: 'grammar', grammar: request.grammar! };
    case 'structural_tag': {
      const tag = request.structural_tag!;
      return { kind: 'structural_tag', structuralTag: typeof tag === 'string' ? tag : JSON.stringify(tag) };
    }
  }
}

/** Both given is ambiguous: a 400. */
export function constraintOf(
  responseFormat: ResponseFormat | null | undefined,
  structuredOutputs: StructuredOutputsRequest | null | undefined,
): StructuredConstraint | null {
  const fromFormat = responseFormatConstraint(responseFormat);
  if (structuredOutputs == null) return fromFormat;
  if (fromFormat !== null) {
    throw new ApiError('invalid_request', 'Set response_format or structured_outputs, not both.', 'structured_outputs');
  }
  return structuredOutputsConstraint(structuredOutputs);
}

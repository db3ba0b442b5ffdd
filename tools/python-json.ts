// JSON as Python's json module writes it: transformers saves config.json, generation_config.json
// and friends with json.dumps(indent=2, sort_keys=True), and a float keeps its ".0".

/** A number that Python's json module would write as a float (1e-05, 10000.0). */
export class PyFloat {
  constructor(readonly value: number) {}
}

/**
 * JSON laid out as Python's `json.dumps(value, indent=2, sort_keys=True)`, which is how
 * transformers writes config.json and friends. Plain numbers are ints; wrap floats in PyFloat.
 */
export function toPythonJson(value: unknown, indent = ''): string {
  if (value instanceof PyFloat) return pythonFloatRepr(value.value);
  if (value === null || typeof value === 'boolean' || typeof value === 'string') return JSON.stringify(value);
  if (typeof value === 'number') {
    if (!Number.isSafeInteger(value)) throw new Error(`${value} is not an integer; wrap floats in PyFloat`);
    return String(value);
  }
  const inner = `${indent}  `;
  if (Array.isArray(value)) {
    if (value.length === 0) return '[]';
    return `[\n${value.map((item) => inner + toPythonJson(item, inner)).join(',\n')}\n${indent}]`;
  }
  if (typeof value === 'object') {
    const keys = Object.keys(value).sort();
    if (keys.length === 0) return '{}';
    const record = value as Record<string, unknown>;
    return `{\n${keys.map((key) => `${inner}${JSON.stringify(key)}: ${toPythonJson(record[key], inner)}`).join(',\n')}\n${indent}}`;
  }
  throw new Error(`cannot write ${typeof value} as JSON`);
}

/** Python's repr(float): shortest round-trip digits, exponent form when the point is far away. */
function pythonFloatRepr(x: number): string {
  if (!Number.isFinite(x)) throw new Error(`${x} has no JSON form`);
  const [mantissa, exponentText] = Math.abs(x).toExponential().split('e');
  const digits = mantissa.replace('.', '');
  const exponent = Number(exponentText);
  const sign = x < 0 || Object.is(x, -0) ? '-' : '';
  const pointPosition = exponent + 1; // digits are 0.DIGITS × 10^pointPosition
  if (pointPosition <= -4 || pointPosition > 16) {
    const fraction = digits.length > 1 ? `.${digits.slice(1)}` : '';
    const exponentSign = exponent < 0 ? '-' : '+';
    return `${sign}${digits[0]}${fraction}e${exponentSign}${String(Math.abs(exponent)).padStart(2, '0')}`;
  }
  if (pointPosition <= 0) return `${sign}0.${'0'.repeat(-pointPosition)}${digits}`;
  if (pointPosition >= digits.length) return `${sign}${digits}${'0'.repeat(pointPosition - digits.length)}.0`;
  return `${sign}${digits.slice(0, pointPosition)}.${digits.slice(pointPosition)}`;
}

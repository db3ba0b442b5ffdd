// Small, dependency-free SVG line charts for the self-contained HTML report.

export interface Series {
  name: string;
  color: string;
  dashed?: boolean;
  points: readonly (readonly [number, number])[];
}

export interface ChartSpec {
  title: string;
  xLabel: string;
  yLabel: string;
  series: readonly Series[];
  /** Draw points as dots as well as lines (few points, e.g. load sweeps). */
  markers?: boolean;
}

const WIDTH = 560;
const PLOT_HEIGHT = 220;
const MARGIN = { left: 64, right: 16, top: 32, bottom: 48 };
const LEGEND_LINE_HEIGHT = 15;
const MAX_LEGEND_CHARS = 80;
const NUM_TICKS = 5;

export function escapeXml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => `&#${c.charCodeAt(0)};`);
}

/** Tick step of 1, 2 or 5 times a power of ten covering the range in about NUM_TICKS steps. */
function niceStep(range: number): number {
  const raw = range / NUM_TICKS;
  const magnitude = 10 ** Math.floor(Math.log10(raw));
  const normalized = raw / magnitude;
  return (normalized <= 1 ? 1 : normalized <= 2 ? 2 : normalized <= 5 ? 5 : 10) * magnitude;
}

function axisRange(values: number[]): { min: number; max: number; step: number } {
  let min = Math.min(0, ...values);
  let max = Math.max(...values);
  if (!(max > min)) max = min + 1;
  const step = niceStep(max - min);
  min = Math.floor(min / step) * step;
  max = Math.ceil(max / step) * step;
  return { min, max, step };
}

function formatTick(value: number): string {
  if (value === 0) return '0';
  const abs = Math.abs(value);
  if (abs >= 1e6) return `${+(value / 1e6).toFixed(1)}M`;
  if (abs >= 1e4) return `${+(value / 1e3).toFixed(1)}k`;
  return `${+value.toPrecision(4)}`;
}

function truncate(text: string): string {
  return text.length <= MAX_LEGEND_CHARS ? text : `${text.slice(0, MAX_LEGEND_CHARS - 1)}…`;
}

export function renderLineChart(spec: ChartSpec): string {
  // One legend line per series under the plot, so long run labels never collide.
  const height = MARGIN.top + PLOT_HEIGHT + MARGIN.bottom + spec.series.length * LEGEND_LINE_HEIGHT;
  const finitePoints = spec.series.flatMap((s) => s.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y)));
  const header = `<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 ${WIDTH} ${height}" width="${WIDTH}" height="${height}" role="img" aria-label="${escapeXml(spec.title)}">`;
  const title = `<text x="${WIDTH / 2}" y="20" text-anchor="middle" class="chart-title">${escapeXml(spec.title)}</text>`;
  if (finitePoints.length === 0) {
    return `${header}${title}<text x="${WIDTH / 2}" y="${height / 2}" text-anchor="middle" class="empty">no data</text></svg>`;
  }
  const xAxis = axisRange(finitePoints.map(([x]) => x));
  const yAxis = axisRange(finitePoints.map(([, y]) => y));
  const plotWidth = WIDTH - MARGIN.left - MARGIN.right;
  const px = (x: number) => MARGIN.left + ((x - xAxis.min) / (xAxis.max - xAxis.min)) * plotWidth;
  const py = (y: number) => MARGIN.top + PLOT_HEIGHT - ((y - yAxis.min) / (yAxis.max - yAxis.min)) * PLOT_HEIGHT;
  const parts: string[] = [header, title];
  for (let y = yAxis.min; y <= yAxis.max + yAxis.step / 2; y += yAxis.step) {
    parts.push(`<line x1="${MARGIN.left}" x2="${WIDTH - MARGIN.right}" y1="${py(y).toFixed(1)}" y2="${py(y).toFixed(1)}" class="grid"/>`);
    parts.push(`<text x="${MARGIN.left - 6}" y="${(py(y) + 4).toFixed(1)}" text-anchor="end" class="tick">${formatTick(y)}</text>`);
  }
  for (let x = xAxis.min; x <= xAxis.max + xAxis.step / 2; x += xAxis.step) {
    parts.push(`<text x="${px(x).toFixed(1)}" y="${MARGIN.top + PLOT_HEIGHT + 16}" text-anchor="middle" class="tick">${formatTick(x)}</text>`);
  }
  parts.push(`<rect x="${MARGIN.left}" y="${MARGIN.top}" width="${plotWidth}" height="${PLOT_HEIGHT}" class="frame"/>`);
  parts.push(`<text x="${MARGIN.left + plotWidth / 2}" y="${MARGIN.top + PLOT_HEIGHT + 34}" text-anchor="middle" class="axis-label">${escapeXml(spec.xLabel)}</text>`);
  parts.push(`<text transform="translate(14 ${MARGIN.top + PLOT_HEIGHT / 2}) rotate(-90)" text-anchor="middle" class="axis-label">${escapeXml(spec.yLabel)}</text>`);
  spec.series.forEach((series, i) => {
    const points = series.points.filter(([x, y]) => Number.isFinite(x) && Number.isFinite(y));
    const path = points.map(([x, y]) => `${px(x).toFixed(1)},${py(y).toFixed(1)}`).join(' ');
    const dash = series.dashed ? ' stroke-dasharray="6 4"' : '';
    parts.push(`<polyline points="${path}" fill="none" stroke="${series.color}" stroke-width="2"${dash}/>`);
    if (spec.markers) {
      for (const [x, y] of points) parts.push(`<circle cx="${px(x).toFixed(1)}" cy="${py(y).toFixed(1)}" r="3.5" fill="${series.color}"/>`);
    }
    const legendX = MARGIN.left;
    const legendY = MARGIN.top + PLOT_HEIGHT + MARGIN.bottom + i * LEGEND_LINE_HEIGHT + 8;
    parts.push(`<line x1="${legendX}" x2="${legendX + 18}" y1="${legendY - 4}" y2="${legendY - 4}" stroke="${series.color}" stroke-width="2"${dash}/>`);
    parts.push(`<text x="${legendX + 24}" y="${legendY}" class="legend">${escapeXml(truncate(series.name))}</text>`);
  });
  parts.push('</svg>');
  return parts.join('');
}

/** Per-step accuracy of a sequence job (a stateful model fed call by call): for each output, the cosine of
 * every variant's step t against FP32's step t, drawn as one line per variant, and the worst step in a table. */
import type { PerStepRow, ReportVariant } from '../../api/types';
import { formatNumber } from '../../format';
import { variantLabel } from './ReportTable';

export interface StepSeries {
  variant: ReportVariant;
  output: string;
  steps: number[];
  cosine: (number | null)[];
  maxAbsError: (number | null)[];
  sequences: number;
}

export function perStepRows(variant: ReportVariant): PerStepRow[] {
  const rows = variant.accuracy?.per_step;
  return Array.isArray(rows) ? (rows as PerStepRow[]) : [];
}

/** One series per (variant, output) of the variants whose accuracy was measured step by step. */
export function stepSeries(variants: ReportVariant[]): StepSeries[] {
  const series: StepSeries[] = [];
  for (const variant of variants) {
    const rows = perStepRows(variant);
    if (rows.length === 0) continue;
    const outputs = [...new Set(rows.flatMap((row) => Object.keys(row.outputs ?? {})))].sort();
    for (const output of outputs) {
      series.push({
        variant,
        output,
        steps: rows.map((row) => row.step),
        cosine: rows.map((row) => row.outputs?.[output]?.cosine ?? null),
        maxAbsError: rows.map((row) => row.outputs?.[output]?.max_abs_error ?? null),
        sequences: Math.max(...rows.map((row) => row.sequences ?? 0)),
      });
    }
  }
  return series;
}

/** The step whose cosine is lowest, with that cosine, and the largest max abs error over all steps. */
export function worstStep(series: StepSeries): { step: number | null; cosine: number | null; maxAbsError: number | null } {
  let step: number | null = null;
  let cosine: number | null = null;
  series.cosine.forEach((value, index) => {
    if (value !== null && (cosine === null || value < cosine)) {
      cosine = value;
      step = series.steps[index];
    }
  });
  const errors = series.maxAbsError.filter((value): value is number => value !== null);
  return { step, cosine, maxAbsError: errors.length ? Math.max(...errors) : null };
}

const WIDTH = 360;
const HEIGHT = 120;
const PAD = 28;
const COLOURS = ['#2563eb', '#dc2626', '#16a34a', '#9333ea', '#ea580c', '#0891b2'];

function StepChart({ output, series }: { output: string; series: StepSeries[] }) {
  const values = series.flatMap((entry) => entry.cosine.filter((value): value is number => value !== null));
  const lastStep = Math.max(1, ...series.flatMap((entry) => entry.steps));
  // The axis reaches 1 (FP32 itself) and goes at least 0.001 below the lowest cosine, so a flat line at
  // 0.99999 is not blown up into a cliff.
  const low = Math.min(1 - 1e-3, ...values);
  const x = (step: number) => PAD + (step / lastStep) * (WIDTH - PAD - 8);
  const y = (value: number) => 8 + ((1 - value) / (1 - low)) * (HEIGHT - PAD);
  return (
    <figure className="per-step-chart" data-testid={`per-step-chart-${output}`}>
      <svg width={WIDTH} height={HEIGHT} role="img" aria-label={`Cosine per step of ${output}, one line per variant`}>
        <line x1={PAD} y1={y(1)} x2={WIDTH - 8} y2={y(1)} stroke="currentColor" strokeOpacity={0.25} />
        <line x1={PAD} y1={y(low)} x2={WIDTH - 8} y2={y(low)} stroke="currentColor" strokeOpacity={0.25} />
        <text x={2} y={y(1) + 4} fontSize={9}>1</text>
        <text x={2} y={y(low) + 4} fontSize={9}>{low.toPrecision(4)}</text>
        <text x={PAD} y={HEIGHT - 4} fontSize={9}>step 0</text>
        <text x={WIDTH - 8} y={HEIGHT - 4} fontSize={9} textAnchor="end">step {lastStep}</text>
        {series.map((entry, index) => {
          const points = entry.steps
            .map((step, position) => [step, entry.cosine[position]] as const)
            .filter((point): point is readonly [number, number] => point[1] !== null)
            .map(([step, value]) => `${x(step).toFixed(1)},${y(value).toFixed(1)}`)
            .join(' ');
          return (
            <polyline key={entry.variant.id} fill="none" stroke={COLOURS[index % COLOURS.length]} strokeWidth={1.5} points={points}>
              <title>{variantLabel(entry.variant)}</title>
            </polyline>
          );
        })}
      </svg>
      <figcaption className="small">
        <strong>{output}</strong>:{' '}
        {series.map((entry, index) => (
          <span key={entry.variant.id} className="per-step-legend">
            <span aria-hidden="true" style={{ color: COLOURS[index % COLOURS.length] }}>■</span> {variantLabel(entry.variant)}{' '}
          </span>
        ))}
      </figcaption>
    </figure>
  );
}

/** The per-step section of one device's report; nothing when no variant ran sequences. */
export function PerStepAccuracy({ variants }: { variants: ReportVariant[] }) {
  const series = stepSeries(variants);
  if (series.length === 0) return null;
  const outputs = [...new Set(series.map((entry) => entry.output))];
  const sequences = Math.max(...series.map((entry) => entry.sequences));
  return (
    <section className="card" aria-labelledby="per-step-heading" data-testid="per-step-accuracy">
      <h3 id="per-step-heading">Accuracy per step</h3>
      <p className="muted small">
        Each sequence was fed call by call with its state carried; step t of every variant is compared with FP32&apos;s
        step t over {sequences} sequence{sequences === 1 ? '' : 's'}. A line that falls with t is error the state accumulates.
      </p>
      <div className="per-step-charts">
        {outputs.map((output) => (
          <StepChart key={output} output={output} series={series.filter((entry) => entry.output === output)} />
        ))}
      </div>
      <table className="table" data-testid="per-step-table">
        <thead>
          <tr>
            <th scope="col">Variant</th>
            <th scope="col">Output</th>
            <th scope="col">Steps</th>
            <th scope="col">Lowest cosine</th>
            <th scope="col">At step</th>
            <th scope="col">Largest max abs error</th>
          </tr>
        </thead>
        <tbody>
          {series.map((entry) => {
            const worst = worstStep(entry);
            return (
              <tr key={`${entry.variant.id}-${entry.output}`}>
                <td>{variantLabel(entry.variant)}</td>
                <td>{entry.output}</td>
                <td>{entry.steps.length}</td>
                <td>{worst.cosine === null ? '—' : formatNumber(worst.cosine, 6)}</td>
                <td>{worst.step ?? '—'}</td>
                <td>{worst.maxAbsError === null ? '—' : worst.maxAbsError.toExponential(2)}</td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </section>
  );
}

import type { ReportVariant } from '../../api/types';

/** What a learned variant's recipe says about its training (workers/learned): method, time, curve. */
export interface LearnedSummary {
  method: string;
  seconds: number;
  curve: number[];
  steps?: number;
  samples?: number;
}

export function learnedSummary(variant: ReportVariant): LearnedSummary | null {
  const learned = (variant.recipe as { learned?: Partial<LearnedSummary> } | null)?.learned;
  if (!learned || !Array.isArray(learned.curve) || learned.curve.length === 0) return null;
  return { method: String(learned.method ?? ''), seconds: Number(learned.seconds ?? 0), curve: learned.curve.map(Number),
    steps: learned.steps, samples: learned.samples };
}

const WIDTH = 240;
const HEIGHT = 70;

function points(curve: number[]): string {
  const low = Math.min(...curve);
  const high = Math.max(...curve);
  const span = high - low || 1;
  const step = curve.length > 1 ? WIDTH / (curve.length - 1) : 0;
  return curve.map((value, index) => `${(index * step).toFixed(1)},${(HEIGHT - ((value - low) / span) * HEIGHT).toFixed(1)}`).join(' ');
}

/** The loss curves and training time of the learned variants measured on one device (one per variant key). */
export function LearningCurves({ variants }: { variants: ReportVariant[] }) {
  const seen = new Set<string>();
  const learned = variants
    .map((variant) => ({ variant, summary: learnedSummary(variant) }))
    .filter((entry): entry is { variant: ReportVariant; summary: LearnedSummary } => {
      const key = entry.variant.key ?? String(entry.variant.id);
      if (!entry.summary || seen.has(key)) return false;
      seen.add(key);
      return true;
    });
  if (learned.length === 0) return null;
  return (
    <section className="card" aria-labelledby="learning-heading" data-testid="learning-curves">
      <h3 id="learning-heading">Learned quantization</h3>
      <div className="learning-curves">
        {learned.map(({ variant, summary }) => (
          <figure key={variant.key ?? variant.id}>
            <svg width={WIDTH} height={HEIGHT} role="img" aria-label={`Loss curve of ${variant.key ?? variant.precision}`}>
              <polyline fill="none" stroke="currentColor" strokeWidth="1.5" points={points(summary.curve)} />
            </svg>
            <figcaption className="small">
              {variant.key ?? variant.precision}: {summary.method}, {summary.seconds.toFixed(1)} s
              {summary.samples ? ` on ${summary.samples} samples` : ''}; loss {summary.curve[0].toPrecision(3)} →{' '}
              {summary.curve[summary.curve.length - 1].toPrecision(3)}
            </figcaption>
          </figure>
        ))}
      </div>
    </section>
  );
}

/** A horizontal bar chart made of list items: readable labels, exact values, screen-reader friendly. */
import type { ReactNode } from 'react';

export interface BarDatum {
  label: string;
  value: number;
  display?: string;
  title?: string;
  /** A line under the bar: what the value is of. */
  detail?: ReactNode;
}

export function BarList({ data, ariaLabel, testId }: { data: BarDatum[]; ariaLabel: string; testId?: string }) {
  const max = Math.max(...data.map((datum) => datum.value), 0) || 1;
  return (
    <ul className="histogram" aria-label={ariaLabel} data-testid={testId}>
      {data.map((datum) => (
        <li key={datum.label} title={datum.title}>
          <span className="histogram-label" title={datum.label}>
            {datum.label}
          </span>
          <span className="histogram-bar" aria-hidden="true">
            <span style={{ width: `${(datum.value / max) * 100}%` }} />
          </span>
          <span className="histogram-value">{datum.display ?? datum.value}</span>
          {datum.detail ? <span className="histogram-detail muted small">{datum.detail}</span> : null}
        </li>
      ))}
    </ul>
  );
}

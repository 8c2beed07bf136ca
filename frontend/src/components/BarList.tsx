/** A horizontal bar chart made of list items: readable labels, exact values, screen-reader friendly. */
export interface BarDatum {
  label: string;
  value: number;
  display?: string;
  title?: string;
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
        </li>
      ))}
    </ul>
  );
}

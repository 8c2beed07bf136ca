/** CSV export of a results table: RFC 4180 quoting, and a button that downloads it. */

export type CsvValue = string | number | boolean | null | undefined;

function cell(value: CsvValue): string {
  if (value === null || value === undefined) return '';
  const text = String(value);
  // Quote what would break a row, and what a spreadsheet would run as a formula.
  const guarded = /^[=+\-@\t\r]/.test(text) && typeof value === 'string' ? `'${text}` : text;
  return /[",\r\n]/.test(guarded) || guarded !== text ? `"${guarded.replace(/"/g, '""')}"` : guarded;
}

export function toCsv(header: string[], rows: CsvValue[][]): string {
  return [header, ...rows].map((row) => row.map(cell).join(',')).join('\r\n') + '\r\n';
}

export function CsvButton({ filename, header, rows, testId = 'csv-export' }: { filename: string; header: string[]; rows: CsvValue[][]; testId?: string }) {
  const download = () => {
    const url = URL.createObjectURL(new Blob([toCsv(header, rows)], { type: 'text/csv;charset=utf-8' }));
    const link = document.createElement('a');
    link.href = url;
    link.download = filename;
    document.body.appendChild(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  };
  return (
    <button type="button" className="button button-small" onClick={download} data-testid={testId}>
      Export CSV
    </button>
  );
}

/** A list's table: the column header row (with a hidden "Actions" header where rows have buttons) around the rows. */
import { useLayoutEffect, useRef, type ReactNode } from 'react';

/** A header; `className` may carry `col-p2`/`col-p3` (hidden on narrower screens), `cardLabel` names a non-text label in cards. */
export type Column = string | { label: ReactNode; className?: string; title?: string; cardLabel?: string };

/**
 * Labels each body cell with its column's header (`data-label`), which the stacked cards of a narrow screen
 * show before the value, and copies the header's priority class to the cells, so that a column hides whole.
 */
export function labelCells(table: HTMLTableElement): void {
  const headers = [...table.querySelectorAll<HTMLTableCellElement>('thead th')];
  for (const row of table.querySelectorAll<HTMLTableRowElement>('tbody tr')) {
    [...row.cells].forEach((cell, index) => {
      const header = headers[index];
      if (!header) return;
      if (!cell.hasAttribute('data-label')) cell.dataset.label = header.dataset.label ?? header.textContent?.trim() ?? '';
      for (const priority of ['col-p2', 'col-p3']) if (header.classList.contains(priority)) cell.classList.add(priority);
    });
  }
}

function HeaderCell({ column }: { column: Column }) {
  if (typeof column === 'string') return <th scope="col">{column}</th>;
  return (
    <th scope="col" className={column.className} title={column.title} data-label={column.cardLabel}>
      {column.label}
    </th>
  );
}

export function DataTable({
  columns,
  actions,
  testId,
  className = 'table table-cards',
  wrapClassName = 'table-wrap',
  caption,
  footer,
  children,
}: {
  columns: Column[];
  /** Rows end in a cell of buttons: the header names it for screen readers only. */
  actions?: boolean;
  testId?: string;
  className?: string;
  wrapClassName?: string;
  caption?: ReactNode;
  /** Below the table, inside its scroll box (a pager). */
  footer?: ReactNode;
  /** The rows (`<tr>`s). */
  children: ReactNode;
}) {
  const table = useRef<HTMLTableElement>(null);
  // After every render: rows come and go with the data.
  useLayoutEffect(() => {
    if (table.current) labelCells(table.current);
  });
  return (
    <div className={wrapClassName}>
      <table ref={table} className={className} data-testid={testId}>
        {caption ? <caption>{caption}</caption> : null}
        <thead>
          <tr>
            {columns.map((column, index) => (
              <HeaderCell key={index} column={column} />
            ))}
            {actions ? (
              <th scope="col">
                <span className="visually-hidden">Actions</span>
              </th>
            ) : null}
          </tr>
        </thead>
        <tbody>{children}</tbody>
      </table>
      {footer}
    </div>
  );
}

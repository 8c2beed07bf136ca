/** A list's table: the column header row (with a hidden "Actions" header where rows have buttons) around the rows. */
import type { ReactNode } from 'react';

export type Column = string | { label: ReactNode; className?: string; title?: string };

function HeaderCell({ column }: { column: Column }) {
  if (typeof column === 'string') return <th scope="col">{column}</th>;
  return (
    <th scope="col" className={column.className} title={column.title}>
      {column.label}
    </th>
  );
}

export function DataTable({
  columns,
  actions,
  testId,
  className = 'table',
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
  return (
    <div className={wrapClassName}>
      <table className={className} data-testid={testId}>
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

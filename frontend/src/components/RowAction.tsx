/** A small button acting on one row (Revoke, Delete, Remove) that asks for confirmation first when given a question. */
import type { ReactNode } from 'react';

export function RowAction({
  label,
  question,
  onConfirm,
  disabled,
  children,
}: {
  /** The accessible name, naming the row (`Revoke token ci`): the visible text alone is the same on every row. */
  label: string;
  /** Asked with `window.confirm`; nothing happens unless the user agrees. Without one the action runs at once. */
  question?: string;
  onConfirm: () => void;
  disabled?: boolean;
  children: ReactNode;
}) {
  return (
    <button
      type="button"
      className="button button-small button-ghost"
      aria-label={label}
      disabled={disabled}
      onClick={() => {
        if (!question || window.confirm(question)) onConfirm();
      }}
    >
      {children}
    </button>
  );
}

/** "Revoke" for something revoked once and for good (a token, an agent): gone once it is revoked. */
export function RevokeAction({
  revoked,
  ...action
}: { revoked: boolean | undefined } & Pick<Parameters<typeof RowAction>[0], 'label' | 'question' | 'onConfirm'>) {
  if (revoked) return null;
  return <RowAction {...action}>Revoke</RowAction>;
}

/** A fetched list's states in one place: its error, then loading, empty, or the list itself. */
import type { ReactNode } from 'react';
import { ErrorMessage, Loading } from './common';

export function ListStates({
  error,
  pending,
  empty,
  whenEmpty = null,
  children,
}: {
  /** Shown above whatever else shows (a failed load, or a failed action on a row). */
  error?: unknown;
  pending: boolean;
  empty: boolean;
  whenEmpty?: ReactNode;
  children: ReactNode;
}) {
  return (
    <>
      <ErrorMessage error={error} />
      {pending ? <Loading /> : empty ? whenEmpty : children}
    </>
  );
}

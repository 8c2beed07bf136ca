/** Small presentational pieces used across pages. */
import { useEffect, useState, type ReactNode } from 'react';
import { errorMessage } from '../api/client';
import { humanize } from '../format';

export function ErrorMessage({ error, title }: { error: unknown; title?: string }) {
  if (!error) return null;
  return (
    <div className="alert alert-error" role="alert">
      {title ? <strong>{title} </strong> : null}
      {errorMessage(error)}
    </div>
  );
}

export function EmptyState({ title, children, action }: { title: string; children?: ReactNode; action?: ReactNode }) {
  return (
    <div className="empty-state" data-testid="empty-state">
      <h3>{title}</h3>
      {children ? <div className="muted">{children}</div> : null}
      {action ? <div className="empty-action">{action}</div> : null}
    </div>
  );
}

export function Loading({ label = 'Loading…' }: { label?: string }) {
  return (
    <div className="loading" role="status" aria-live="polite">
      <span className="spinner" aria-hidden="true" />
      {label}
    </div>
  );
}

const STATUS_TONE: Record<string, string> = {
  succeeded: 'good',
  done: 'good',
  online: 'good',
  running: 'active',
  building: 'active',
  ready: 'good',
  leased: 'active',
  waiting_for_devices: 'warn',
  queued: 'neutral',
  pending: 'neutral',
  skipped: 'neutral',
  offline: 'neutral',
  canceled: 'neutral',
  revoked: 'bad',
  failed: 'bad',
};

export function StatusBadge({ status, label }: { status: string; label?: string }) {
  const tone = STATUS_TONE[status] ?? 'neutral';
  return (
    <span className={`badge badge-${tone}`} data-status={status}>
      {label ?? humanize(status)}
    </span>
  );
}

export function ProgressBar({ value, label, small }: { value: number | null | undefined; label: string; small?: boolean }) {
  const known = value !== null && value !== undefined && !Number.isNaN(value);
  const clamped = known ? Math.max(0, Math.min(1, value)) : 0;
  return (
    <div
      className={`progress${small ? ' progress-small' : ''}${known ? '' : ' progress-indeterminate'}`}
      role="progressbar"
      aria-label={label}
      aria-valuemin={0}
      aria-valuemax={100}
      aria-valuenow={known ? Math.round(clamped * 100) : undefined}
    >
      <div className="progress-fill" style={{ width: `${known ? clamped * 100 : 30}%` }} />
    </div>
  );
}

export function CopyButton({ text, label = 'Copy' }: { text: string; label?: string }) {
  const [state, setState] = useState<'idle' | 'copied' | 'failed'>('idle');
  const copy = async () => {
    try {
      if (navigator.clipboard?.writeText) {
        await navigator.clipboard.writeText(text);
      } else {
        throw new Error('no clipboard');
      }
      setState('copied');
    } catch {
      setState('failed');
    }
    window.setTimeout(() => setState('idle'), 2000);
  };
  return (
    <button type="button" className="button button-small" onClick={copy} aria-live="polite">
      {state === 'copied' ? 'Copied' : state === 'failed' ? 'Select and copy manually' : label}
    </button>
  );
}

/** A secret shown exactly once, with a copy button and a warning that it will not come back. */
export function SecretReveal({ label, value, testId, children }: { label: string; value: string; testId: string; children?: ReactNode }) {
  return (
    <div className="secret" data-testid={testId}>
      <p>
        <strong>{label}</strong> — copy it now; Kiln will not show it again.
      </p>
      <div className="secret-row">
        <code className="secret-value" tabIndex={0} aria-label={label}>
          {value}
        </code>
        <CopyButton text={value} />
      </div>
      {children}
    </div>
  );
}

/** Sets the browser tab's title to "<page> · Kiln" while the page is shown. */
export function useDocumentTitle(title: string | null | undefined) {
  useEffect(() => {
    if (title) document.title = `${title} · Kiln`;
  }, [title]);
}

export function PageHeader({
  title,
  subtitle,
  actions,
  documentTitle,
}: {
  title: ReactNode;
  subtitle?: ReactNode;
  actions?: ReactNode;
  /** The tab title, when `title` is not plain text. */
  documentTitle?: string;
}) {
  useDocumentTitle(documentTitle ?? (typeof title === 'string' ? title : null));
  return (
    <header className="page-header">
      <div>
        <h1>{title}</h1>
        {subtitle ? <p className="muted">{subtitle}</p> : null}
      </div>
      {actions ? <div className="page-actions">{actions}</div> : null}
    </header>
  );
}

/** Previous / next through a paginated list, with where the user is. */
export function Pager({
  page,
  count,
  pageSize,
  onPage,
  label,
}: {
  page: number;
  count: number;
  pageSize: number;
  onPage: (page: number) => void;
  label: string;
}) {
  const pages = Math.max(1, Math.ceil(count / pageSize));
  if (count <= pageSize && page === 1) return null;
  const first = (page - 1) * pageSize + 1;
  const last = Math.min(count, page * pageSize);
  return (
    <nav className="pager" aria-label={`${label} pages`} data-testid="pager">
      <button type="button" className="button button-small" disabled={page <= 1} onClick={() => onPage(page - 1)}>
        Previous
      </button>
      <span className="muted small" data-testid="pager-status">
        {first}–{last} of {count} · page {page} of {pages}
      </span>
      <button type="button" className="button button-small" disabled={page >= pages} onClick={() => onPage(page + 1)}>
        Next
      </button>
    </nav>
  );
}

/** Personal API tokens for scripts: create (shown once), list, revoke. */
import { useId, useState, type FormEvent } from 'react';
import { rows, useCreateToken, useRevokeToken, useTokens } from '../api/hooks';
import type { ApiToken } from '../api/types';
import { EmptyState, ErrorMessage, Loading, PageHeader, SecretReveal, StatusBadge } from '../components/common';
import { formatDate, formatRelative } from '../format';

const EXPIRY_CHOICES = [
  { value: '7', label: '7 days' },
  { value: '30', label: '30 days' },
  { value: '90', label: '90 days' },
  { value: '365', label: '1 year' },
  { value: 'never', label: 'Never' },
];

function tokenState(token: ApiToken): { status: string; label: string } {
  if (token.revoked) return { status: 'revoked', label: 'Revoked' };
  if (token.expires_at && new Date(token.expires_at).getTime() < Date.now()) return { status: 'canceled', label: 'Expired' };
  return { status: 'succeeded', label: 'Active' };
}

export function TokensPage() {
  const tokens = useTokens();
  const create = useCreateToken();
  const revoke = useRevokeToken();
  const [name, setName] = useState('');
  const [expiry, setExpiry] = useState('30');
  const [created, setCreated] = useState<ApiToken | null>(null);
  const nameId = useId();
  const expiryId = useId();
  const list = rows(tokens.data);

  const submit = (event: FormEvent) => {
    event.preventDefault();
    create.mutate(
      { name: name.trim(), expires_in_days: expiry === 'never' ? null : Number(expiry) },
      {
        onSuccess: (token) => {
          setCreated(token);
          setName('');
        },
      },
    );
  };

  return (
    <>
      <PageHeader
        title="API tokens"
        subtitle={
          <>
            For scripts and CI: send <code>Authorization: Bearer kiln_pat_…</code>. A token acts for you in the current
            organization.
          </>
        }
      />
      <section className="card" aria-labelledby="new-token-heading">
        <h2 id="new-token-heading">Create a token</h2>
        <form className="form-row" onSubmit={submit} aria-label="Create API token">
          <div className="field">
            <label htmlFor={nameId}>Name</label>
            <input
              id={nameId}
              required
              value={name}
              placeholder="e.g. ci-pipeline"
              onChange={(event) => setName(event.target.value)}
              data-testid="token-name"
            />
          </div>
          <div className="field">
            <label htmlFor={expiryId}>Expires after</label>
            <select id={expiryId} value={expiry} onChange={(event) => setExpiry(event.target.value)} data-testid="token-expiry">
              {EXPIRY_CHOICES.map((choice) => (
                <option key={choice.value} value={choice.value}>
                  {choice.label}
                </option>
              ))}
            </select>
          </div>
          <div className="field field-end">
            <button type="submit" className="button button-primary" disabled={create.isPending || !name.trim()}>
              Create token
            </button>
          </div>
        </form>
        <ErrorMessage error={create.error} />
        {created?.token ? <SecretReveal label={`API token “${created.name}”`} value={created.token} testId="token-secret" /> : null}
      </section>

      <section className="card" aria-labelledby="tokens-heading">
        <h2 id="tokens-heading">Your tokens</h2>
        <ErrorMessage error={tokens.error ?? revoke.error} />
        {tokens.isPending ? (
          <Loading />
        ) : list.length === 0 ? (
          <EmptyState title="No tokens yet.">Create one above to call the API from scripts.</EmptyState>
        ) : (
          <div className="table-wrap">
            <table className="table" data-testid="tokens-table">
              <thead>
                <tr>
                  <th scope="col">Name</th>
                  <th scope="col">Prefix</th>
                  <th scope="col">Created</th>
                  <th scope="col">Expires</th>
                  <th scope="col">Last used</th>
                  <th scope="col">Status</th>
                  <th scope="col">
                    <span className="visually-hidden">Actions</span>
                  </th>
                </tr>
              </thead>
              <tbody>
                {list.map((token) => {
                  const state = tokenState(token);
                  return (
                    <tr key={token.id} data-testid="token-row">
                      <td>{token.name}</td>
                      <td>
                        <code>{token.prefix}…</code>
                      </td>
                      <td>{formatDate(token.created_at)}</td>
                      <td>{token.expires_at ? formatDate(token.expires_at) : 'Never'}</td>
                      <td>{token.last_used_at ? formatRelative(token.last_used_at) : 'Never'}</td>
                      <td>
                        <StatusBadge status={state.status} label={state.label} />
                      </td>
                      <td>
                        {!token.revoked ? (
                          <button
                            type="button"
                            className="button button-small button-ghost"
                            aria-label={`Revoke token ${token.name}`}
                            onClick={() => {
                              if (window.confirm(`Revoke ${token.name}? Scripts using it stop working at once.`)) revoke.mutate(token.id);
                            }}
                          >
                            Revoke
                          </button>
                        ) : null}
                      </td>
                    </tr>
                  );
                })}
              </tbody>
            </table>
          </div>
        )}
      </section>
    </>
  );
}

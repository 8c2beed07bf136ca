/** Personal API tokens for scripts: create (shown once), list, revoke. */
import { useState } from 'react';
import { rows, useCreateToken, useRevokeToken, useTokens } from '../api/hooks';
import type { ApiToken, ApiTokenCreated } from '../api/types';
import { EmptyState, ErrorMessage, PageHeader, SecretReveal, StatusBadge } from '../components/common';
import { DataTable } from '../components/DataTable';
import { InlineForm, SelectField, TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { RevokeAction } from '../components/RowAction';
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
  const [created, setCreated] = useState<ApiTokenCreated | null>(null);
  const list = rows(tokens.data);

  const submit = () => {
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
        <InlineForm label="Create API token" submitLabel="Create token" disabled={create.isPending || !name.trim()} onSubmit={submit}>
          <TextField
            label="Name"
            required
            value={name}
            placeholder="e.g. ci-pipeline"
            onChange={(event) => setName(event.target.value)}
            data-testid="token-name"
          />
          <SelectField label="Expires after" value={expiry} onChange={(event) => setExpiry(event.target.value)} data-testid="token-expiry">
            {EXPIRY_CHOICES.map((choice) => (
              <option key={choice.value} value={choice.value}>
                {choice.label}
              </option>
            ))}
          </SelectField>
        </InlineForm>
        <ErrorMessage error={create.error} />
        {created?.token ? <SecretReveal label={`API token “${created.name}”`} value={created.token} testId="token-secret" /> : null}
      </section>

      <section className="card" aria-labelledby="tokens-heading">
        <h2 id="tokens-heading">Your tokens</h2>
        <ListStates
          error={tokens.error ?? revoke.error}
          pending={tokens.isPending}
          empty={list.length === 0}
          whenEmpty={<EmptyState title="No tokens yet.">Create one above to call the API from scripts.</EmptyState>}
        >
          <DataTable columns={['Name', 'Prefix', 'Created', 'Expires', 'Last used', 'Status']} actions testId="tokens-table">
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
                    <RevokeAction
                      revoked={token.revoked}
                      label={`Revoke token ${token.name}`}
                      question={`Revoke ${token.name}? Scripts using it stop working at once.`}
                      onConfirm={() => revoke.mutate(token.id)}
                    />
                  </td>
                </tr>
              );
            })}
          </DataTable>
        </ListStates>
      </section>
    </>
  );
}

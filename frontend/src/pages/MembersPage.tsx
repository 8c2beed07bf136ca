/** The current organization's members: everyone may look; owners add people, change roles and remove them. */
import { useId, useState } from 'react';
import { useQueryClient } from '@tanstack/react-query';
import { rows, useAddMember, useChangeMemberRole, useMe, useMembers, useRemoveMember } from '../api/hooks';
import { ROLES, type Member, type Role } from '../api/types';
import { EmptyState, ErrorMessage, PageHeader } from '../components/common';
import { DataTable } from '../components/DataTable';
import { InlineForm, SelectField, TextField } from '../components/FormFields';
import { ListStates } from '../components/ListStates';
import { RowAction } from '../components/RowAction';
import { formatDate, humanize } from '../format';

function RoleOptions() {
  return (
    <>
      {ROLES.map((role) => (
        <option key={role} value={role}>
          {humanize(role)}
        </option>
      ))}
    </>
  );
}

function AddMemberForm() {
  const add = useAddMember();
  const [username, setUsername] = useState('');
  const [role, setRole] = useState<Role>('member');
  const [added, setAdded] = useState<Member | null>(null);

  const submit = () => {
    setAdded(null);
    add.mutate(
      { username: username.trim(), role },
      {
        onSuccess: (member) => {
          setAdded(member);
          setUsername('');
        },
      },
    );
  };

  return (
    <section className="card" aria-labelledby="add-member-heading">
      <h2 id="add-member-heading">Add member</h2>
      <p className="muted small">
        The person signs up first; then add them here by their username. Owners manage members and everything else;
        members upload models and data and start deployments; viewers can look at everything but not change it.
      </p>
      <InlineForm label="Add member" submitLabel="Add member" disabled={add.isPending || !username.trim()} onSubmit={submit}>
        <TextField
          label="Username"
          required
          autoComplete="off"
          spellCheck={false}
          value={username}
          placeholder="e.g. grace"
          onChange={(event) => setUsername(event.target.value)}
          data-testid="member-username"
        />
        <SelectField label="Role" value={role} onChange={(event) => setRole(event.target.value as Role)} data-testid="member-role">
          <RoleOptions />
        </SelectField>
      </InlineForm>
      <ErrorMessage error={add.error} />
      <p className="small" role="status" data-testid="member-added">
        {added && !add.error ? `Added ${added.username} as ${added.role}.` : ''}
      </p>
    </section>
  );
}

function MemberRow({ member, isOwner, isSelf, organizationName }: { member: Member; isOwner: boolean; isSelf: boolean; organizationName: string }) {
  const client = useQueryClient();
  const changeRole = useChangeMemberRole();
  const remove = useRemoveMember();
  const [draft, setDraft] = useState<Role | null>(null);
  const [error, setError] = useState<unknown>(null);
  const selectId = useId();
  const role = draft ?? member.role;
  const busy = changeRole.isPending || remove.isPending;

  const saveRole = () => {
    if (!draft || draft === member.role) return;
    setError(null);
    changeRole.mutate(
      { id: member.id, role: draft },
      {
        onSuccess: () => setDraft(null),
        onError: (failure) => {
          // The select goes back to the role the member still has; the message says why.
          setDraft(null);
          setError(failure);
        },
      },
    );
  };

  const removeQuestion = isSelf
    ? `Leave ${organizationName}? You lose access to it at once.`
    : `Remove ${member.username} from ${organizationName}? Their API tokens for it are revoked.`;

  const removeMember = () => {
    setError(null);
    remove.mutate(member.id, {
      onSuccess: () => {
        if (isSelf) {
          // Like switching organization: nothing of this organization may stay on screen.
          client.clear();
          window.location.assign('/models');
        }
      },
      onError: setError,
    });
  };

  return (
    <>
      <tr data-testid="member-row" data-username={member.username}>
        <td>
          {member.username}
          {isSelf ? <span className="muted small"> (you)</span> : null}
        </td>
        <td>
          {isOwner ? (
            <div className="field-inline">
              <label htmlFor={selectId} className="visually-hidden">
                Role of {member.username}
              </label>
              <select
                id={selectId}
                value={role}
                disabled={busy}
                onChange={(event) => {
                  setError(null);
                  setDraft(event.target.value as Role);
                }}
                data-testid="member-row-role"
              >
                <RoleOptions />
              </select>
              {draft && draft !== member.role ? (
                <>
                  <button
                    type="button"
                    className="button button-small button-primary"
                    onClick={saveRole}
                    disabled={busy}
                    aria-label={`Save role of ${member.username}`}
                  >
                    Save
                  </button>
                  <button
                    type="button"
                    className="button button-small button-ghost"
                    onClick={() => setDraft(null)}
                    disabled={busy}
                    aria-label={`Keep role of ${member.username}`}
                  >
                    Cancel
                  </button>
                </>
              ) : null}
            </div>
          ) : (
            humanize(member.role)
          )}
        </td>
        <td>{formatDate(member.created_at)}</td>
        {isOwner ? (
          <td>
            <RowAction
              label={isSelf ? `Leave ${organizationName}` : `Remove ${member.username}`}
              question={removeQuestion}
              onConfirm={removeMember}
              disabled={busy}
            >
              {isSelf ? 'Leave' : 'Remove'}
            </RowAction>
          </td>
        ) : null}
      </tr>
      {error ? (
        <tr data-testid="member-row-error">
          <td colSpan={isOwner ? 4 : 3}>
            <ErrorMessage error={error} title={`${member.username}:`} />
          </td>
        </tr>
      ) : null}
    </>
  );
}

export function MembersPage() {
  const me = useMe().data;
  const members = useMembers();
  const organization = me?.organization;
  const isOwner = organization?.role === 'owner';
  const list = rows(members.data);

  return (
    <>
      <PageHeader
        title="Members"
        subtitle={organization ? <>People in {organization.name} and what each may do.</> : undefined}
      />
      {!organization ? null : isOwner ? (
        <AddMemberForm />
      ) : (
        <p className="muted" data-testid="members-read-only">
          Only owners change members. You are {organization.role === 'member' ? 'a member' : 'a viewer'} here; ask an
          owner to add someone or change a role.
        </p>
      )}
      <section className="card" aria-labelledby="members-heading">
        <h2 id="members-heading">Members</h2>
        <ListStates
          error={members.error}
          pending={members.isPending}
          empty={members.isError || list.length === 0}
          whenEmpty={members.isError ? null : <EmptyState title="No members to show." />}
        >
          <DataTable
            columns={['Username', 'Role', 'Joined']}
            actions={isOwner}
            className={`table table-cards${isOwner ? ' table-controls' : ''}`}
            testId="members-table"
          >
            {list.map((member) => (
              <MemberRow
                key={member.id}
                member={member}
                isOwner={isOwner}
                isSelf={member.user === me?.user.id}
                organizationName={organization?.name ?? 'this organization'}
              />
            ))}
          </DataTable>
        </ListStates>
      </section>
    </>
  );
}

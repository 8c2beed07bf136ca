/** Labelled form fields and the one-row form they sit in, so every label is tied to its control the same way. */
import { useId, type FormEvent, type InputHTMLAttributes, type ReactNode, type SelectHTMLAttributes } from 'react';

/** A labelled text input; other input attributes (value, onChange, required, data-testid…) go to the input. */
export function TextField({
  label,
  className = 'field',
  ...input
}: { label: ReactNode; className?: string } & Omit<InputHTMLAttributes<HTMLInputElement>, 'id' | 'className'>) {
  const id = useId();
  return (
    <div className={className}>
      <label htmlFor={id}>{label}</label>
      <input id={id} {...input} />
    </div>
  );
}

/** A labelled select of `children` options, with what belongs under it (`after`: a note, an error) in the same field. */
export function SelectField({
  label,
  after,
  children,
  ...select
}: { label: ReactNode; after?: ReactNode; children: ReactNode } & Omit<SelectHTMLAttributes<HTMLSelectElement>, 'id' | 'children'>) {
  const id = useId();
  return (
    <div className="field">
      <label htmlFor={id}>{label}</label>
      <select id={id} {...select}>
        {children}
      </select>
      {after}
    </div>
  );
}

/** One `<option>` per named thing (a model's inputs or outputs), valued and shown by its name. */
export function NameOptions({ items }: { items: { name: string }[] }) {
  return (
    <>
      {items.map(({ name }) => (
        <option key={name} value={name}>
          {name}
        </option>
      ))}
    </>
  );
}

/** A one-row form (fields, then the primary button at their end) that never reloads the page. */
export function InlineForm({
  label,
  submitLabel,
  disabled,
  onSubmit,
  children,
}: {
  /** The form's accessible name. */
  label: string;
  submitLabel: ReactNode;
  disabled: boolean;
  onSubmit: () => void;
  children: ReactNode;
}) {
  const submit = (event: FormEvent) => {
    event.preventDefault();
    onSubmit();
  };
  return (
    <form className="form-row" onSubmit={submit} aria-label={label}>
      {children}
      <div className="field field-end">
        <button type="submit" className="button button-primary" disabled={disabled}>
          {submitLabel}
        </button>
      </div>
    </form>
  );
}

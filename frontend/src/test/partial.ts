/** Test fixtures that state only what a test reads. The wire types are generated from the server's schema and complete; a
 * fixture built with `partial` may leave fields out, but every field it gives must have the schema's type. */
export type DeepPartial<T> = T extends readonly (infer U)[]
  ? DeepPartial<U>[]
  : T extends object
    ? { [K in keyof T]?: DeepPartial<T[K]> }
    : T;

export function partial<T>(value: DeepPartial<T>): T {
  return value as T;
}

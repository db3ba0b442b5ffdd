// Original file: proto/engine.proto


export interface _conduit_engine_v1_StructuredOutput_Choice {
  'choices'?: (string)[];
}

export interface _conduit_engine_v1_StructuredOutput_Choice__Output {
  'choices': (string)[];
}

export interface StructuredOutput {
  'jsonSchema'?: (string);
  'jsonObject'?: (boolean);
  'regex'?: (string);
  'choice'?: (_conduit_engine_v1_StructuredOutput_Choice | null);
  'grammar'?: (string);
  'structuralTag'?: (string);
  'constrainAfter'?: (string);
  'jumpForward'?: (boolean);
  'prefixTokenIds'?: (number)[];
  'constraint'?: "jsonSchema"|"jsonObject"|"regex"|"choice"|"grammar"|"structuralTag";
  '_constrainAfter'?: "constrainAfter";
  '_jumpForward'?: "jumpForward";
}

export interface StructuredOutput__Output {
  'jsonSchema'?: (string);
  'jsonObject'?: (boolean);
  'regex'?: (string);
  'choice'?: (_conduit_engine_v1_StructuredOutput_Choice__Output | null);
  'grammar'?: (string);
  'structuralTag'?: (string);
  'constrainAfter'?: (string);
  'jumpForward'?: (boolean);
  'prefixTokenIds': (number)[];
  'constraint'?: "jsonSchema"|"jsonObject"|"regex"|"choice"|"grammar"|"structuralTag";
  '_constrainAfter'?: "constrainAfter";
  '_jumpForward'?: "jumpForward";
}

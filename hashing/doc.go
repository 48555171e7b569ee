// Package hashing turns an OpenAI-style request into the key that decides which requests
// deduplicate: a SHA-256 over the tenant scope, the method and path, and the canonical body.
//
// Two requests share a key, and so share one upstream call and its answer, exactly when
// they come from the same scope, go to the same method and path, and their bodies mean the
// same thing. "Mean the same" is deliberately narrow: spellings that JSON itself treats as
// equal (key order, whitespace, escapes, 1 and 1.0) are equal, and so are the few spellings
// the OpenAI API documents as equal (see Folding rules). Anything else that could change what
// the model sees keeps requests apart: strings are never trimmed or lower-cased.
//
// # How a key is made
//
//	key = hex(sha256(scope ‖ 0x00 ‖ method " " path ‖ 0x00 ‖ canonical body))
//
// The scope (see Scopes) and the canonical body never contain a zero byte, so the three
// parts cannot run into each other. The path is hashed as given; the proxy passes the URL
// path and its query string with the parameters in sorted order (an upstream may read the
// query, as Azure's api-version: ?b=2&a=1 and ?a=1&b=2 make one key, no query another).
// The method is hashed as sent (HTTP methods are case-sensitive).
//
// # The canonical body
//
// The body must be one JSON object (RFC 8259), with nothing but whitespace after it, strings
// in valid UTF-8, and at most 1000 levels of nested arrays and objects; anything else is
// rejected with an error wrapping [ErrInvalidJSON] that says what is wrong and where. An
// object that names the same key twice is rejected too: parsers disagree on which one wins
// (first, last, or an error), so the proxy cannot know what the upstream will read.
//
// The configured ignored fields (the proxy's default: "user") are dropped from the top-level object,
// the folding rules are applied, and the result is written back:
//
//   - object keys sorted by their bytes in UTF-8, which is Unicode code point order (RFC 8785
//     sorts by UTF-16 code units instead; the two differ only for keys that mix characters
//     above U+FFFF with U+E000–U+FFFF, and the canonical text is ours alone, so the simpler
//     order wins);
//   - no whitespace between tokens;
//   - strings decoded and written again with one escaping: \" \\ \b \f \n \r \t, \u00xx for
//     the other control characters, every other character as itself in UTF-8 (so "\u0041"
//     and "A", "\/" and "/" are equal). A lone surrogate escape such as "\ud800" stays the
//     escape "\ud800": it is not a character, and replacing it would make distinct bodies
//     equal;
//   - numbers in the form described next.
//
// # Numbers
//
// Numbers are compared by exact decimal value, never through float64, so big integers and
// long decimals stay distinct: 1, 1.0, 1.00, 1e0 and 10e-1 are the same number, -0 is 0, and
// 12345678901234567890 differs from 12345678901234567891. A number is written as
//
//   - an integer in full ("100", "-42") unless it ends in more than 20 zeros;
//   - a decimal fraction in full ("0.5", "3.14", "0.000001") unless it starts with more than
//     five zeros after the point;
//   - otherwise d.ddde±N with no trailing zeros in the digits ("1e+21", "1.5e-7").
//
// # Folding rules
//
// A folding rule rewrites one spelling of a request into another that the API defines to
// mean the same, so both get one key. Each rule is named, applies only to the endpoints it
// names (matched by path suffix, so "/v1/chat/completions" and Azure's
// "/openai/deployments/NAME/chat/completions" both match), and fires only on the exact
// shape it describes; [Request.Folded] lists the rules that changed a body.
//
//   - chat-content-single-text-part (…/chat/completions): a message whose "content" is an
//     array of exactly one part {"type":"text","text":S}, with no other field, has content S.
//     The API reference gives content either as the text of the message or as an array of
//     content parts, and one text part is that same text. Two text parts are not folded
//     into one string: the API keeps them as separate parts.
//   - responses-input-single-user-message (…/responses): an "input" that is an array of
//     exactly one item {"role":"user","content":S}, with S a string and no other field, is
//     the input S. The API reference defines a string input as "equivalent to a text input
//     with the user role".
//
// Spellings that look alike but are not documented as equal are left apart: a Responses
// message with "type":"message" or with [{"type":"input_text","text":S}] content, a
// Responses "instructions" string versus a developer message, and "n":1 versus no "n"
// (defaults can change between model versions).
//
// [Canonicalize] knows no endpoint and applies no folding rule; [Request.Canonical] holds the
// exact text a key was made from.
//
// # Scopes
//
// The scope keeps tenants apart and is the first part of the hashed text, tagged with its
// kind so that two kinds can never produce the same text:
//
//   - credential (the default, and the zero [Scope]): "credential:" followed by a SHA-256 of
//     the Authorization, Api-Key (Azure-style clients), OpenAI-Organization and OpenAI-Project
//     headers, each with all its values. Two API keys, or one key used for two projects,
//     never share a result, and a request with a wrong key never gets what a valid key
//     produced. The raw credential is never part of the key.
//   - header:NAME: "header:NAME:" followed by a SHA-256 of that header's values. For
//     gateways that put the tenant in a header of their own.
//   - global: the constant "global". Every client shares results; safe only when the proxy
//     itself authenticates clients and they are allowed to see each other's answers.
//
// # Namespaces
//
// [Hasher.KeyIn] adds a [Namespace] to the scope part: ";ns=" and the name in hex, then
// ";gen=" and the namespace's generation in decimal. ';' is not part of any scope's text
// (header names are tokens, the rest is fixed or hex), so no namespaced key can be made
// without one. The zero Namespace adds nothing: [Hasher.Key]'s keys are unchanged. A new
// generation makes new keys for every request of the namespace, which is how a whole
// namespace is purged at once.
package hashing

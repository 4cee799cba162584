package task

import (
	"bytes"
	"encoding"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation/field"
	kjson "sigs.k8s.io/json"
)

// decodeStrict decodes JSON into v (a pointer to a struct) and returns every decoding
// problem with its field path: values of the wrong type, unknown fields and duplicate
// fields. A value of the wrong type is left at its zero value and the rest of the
// document is decoded, so that the caller can validate what was decoded and report
// everything at once. The error is for a document that cannot be decoded at all.
func decodeStrict(js []byte, v any) (field.ErrorList, error) {
	strict, err := kjson.UnmarshalStrict(js, v)
	var errs field.ErrorList
	if err != nil {
		// The decoder stops reporting at the first value of the wrong type (without
		// its list indices) and then drops the strict errors: find every mistyped
		// value, remove it and decode again.
		var cleaned []byte
		errs, cleaned = typeErrors(js, reflect.TypeOf(v).Elem())
		if len(errs) == 0 {
			return nil, decodeError(err)
		}
		reflect.ValueOf(v).Elem().SetZero()
		if strict, err = kjson.UnmarshalStrict(cleaned, v); err != nil {
			return nil, decodeError(err)
		}
	}
	for _, e := range strict {
		var fe kjson.FieldError
		if !errors.As(e, &fe) {
			errs = append(errs, field.Invalid(nil, nil, e.Error()))
			continue
		}
		p := field.NewPath(fe.FieldPath())
		if strings.HasPrefix(e.Error(), "duplicate field") {
			errs = append(errs, field.Duplicate(p, "set it only once"))
		} else {
			errs = append(errs, field.Forbidden(p, "unknown field: check its spelling and indentation (see docs/task-format.md)"))
		}
	}
	return errs, nil
}

var typeError = regexp.MustCompile(`cannot unmarshal (.+?) into Go (?:struct field \S+|value) of type (\S+)`)

// decodeError reports a document the decoder gave up on.
func decodeError(err error) error {
	return fmt.Errorf("decoding task: %w", err)
}

// typeErrors walks the JSON document js alongside the Go type t, as encoding/json would
// decode it, and returns an error for every value that does not fit its field (with
// list indices and map keys in the path), and the document with those values replaced
// by null.
func typeErrors(js []byte, t reflect.Type) (field.ErrorList, []byte) {
	d := json.NewDecoder(bytes.NewReader(js))
	d.UseNumber()
	var doc any
	if err := d.Decode(&doc); err != nil {
		return nil, nil
	}
	c := &typeChecker{fields: map[reflect.Type][]jsonField{}}
	c.check(doc, t, nil)
	if len(c.errs) == 0 {
		return nil, nil
	}
	out, err := json.Marshal(doc)
	if err != nil {
		return nil, nil
	}
	return c.errs, out
}

type typeChecker struct {
	errs   field.ErrorList
	fields map[reflect.Type][]jsonField
}

type jsonField struct {
	name string
	typ  reflect.Type
}

var (
	jsonUnmarshaler = reflect.TypeFor[json.Unmarshaler]()
	textUnmarshaler = reflect.TypeFor[encoding.TextUnmarshaler]()
)

// check reports whether v may stay in the document as a value of type t, recording
// an error for it or for what it contains; values inside v that do not fit are
// replaced by nil.
func (c *typeChecker) check(v any, t reflect.Type, p *field.Path) bool {
	if v == nil {
		return true
	}
	pt := reflect.PointerTo(t)
	if pt.Implements(jsonUnmarshaler) || pt.Implements(textUnmarshaler) {
		return c.leaf(v, t, p)
	}
	switch t.Kind() {
	case reflect.Pointer:
		return c.check(v, t.Elem(), p)
	case reflect.Interface:
		return true
	case reflect.Struct:
		m, ok := v.(map[string]any)
		if !ok {
			return c.mismatch(v, t, p)
		}
		for _, f := range c.jsonFields(t) {
			if fv, ok := m[f.name]; ok && !c.check(fv, f.typ, p.Child(f.name)) {
				m[f.name] = nil
			}
		}
		return true
	case reflect.Map:
		m, ok := v.(map[string]any)
		if !ok {
			return c.mismatch(v, t, p)
		}
		keys := make([]string, 0, len(m))
		for k := range m {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			if !c.check(m[k], t.Elem(), p.Key(k)) {
				m[k] = nil
			}
		}
		return true
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return c.leaf(v, t, p) // []byte is a base64 string
		}
		a, ok := v.([]any)
		if !ok {
			return c.mismatch(v, t, p)
		}
		for i := range a {
			if !c.check(a[i], t.Elem(), p.Index(i)) {
				a[i] = nil
			}
		}
		return true
	}
	return c.leaf(v, t, p)
}

// leaf decodes v alone into a new value of type t: the decoder's own verdict.
func (c *typeChecker) leaf(v any, t reflect.Type, p *field.Path) bool {
	pt := reflect.PointerTo(t)
	b, err := json.Marshal(v)
	if err != nil {
		return c.mismatch(v, t, p)
	}
	err = kjson.UnmarshalCaseSensitivePreserveInts(b, reflect.New(t).Interface())
	if err == nil {
		return true
	}
	if m := typeError.FindStringSubmatch(err.Error()); m != nil {
		if t.Kind() == reflect.Struct || pt.Implements(jsonUnmarshaler) {
			// A type with its own decoding says what it wanted.
			c.errs = append(c.errs, field.Invalid(p, jsonKind(v), "must be "+goTypeName(m[2])))
			return false
		}
		return c.mismatch(v, t, p)
	}
	// A type with its own decoding (a quantity, a time) rejected the value.
	bad := any(jsonKind(v))
	if s, ok := v.(string); ok {
		bad = s
	}
	c.errs = append(c.errs, field.Invalid(p, bad, strings.TrimPrefix(err.Error(), "json: ")))
	return false
}

func (c *typeChecker) mismatch(v any, t reflect.Type, p *field.Path) bool {
	c.errs = append(c.errs, field.Invalid(p, jsonKind(v), "must be "+kindName(t)))
	return false
}

// jsonFields lists the fields encoding/json decodes into a struct of type t, in
// declaration order, with the fields of embedded structs without a JSON name (the
// Kubernetes ",inline" ones) in place.
func (c *typeChecker) jsonFields(t reflect.Type) []jsonField {
	if fs, ok := c.fields[t]; ok {
		return fs
	}
	var out []jsonField
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, _, _ := strings.Cut(tag, ",")
		if f.Anonymous && name == "" {
			ft := f.Type
			if ft.Kind() == reflect.Pointer {
				ft = ft.Elem()
			}
			if ft.Kind() == reflect.Struct {
				for _, inner := range c.jsonFields(ft) {
					if !slices.ContainsFunc(out, func(o jsonField) bool { return o.name == inner.name }) {
						out = append(out, inner)
					}
				}
				continue
			}
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		out = append(out, jsonField{name: name, typ: f.Type})
	}
	c.fields[t] = out
	return out
}

// jsonKind names the kind of a decoded JSON value as encoding/json's errors do.
func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case json.Number, float64:
		return "number"
	case bool:
		return "bool"
	case []any:
		return "array"
	case map[string]any:
		return "object"
	}
	return fmt.Sprintf("%T", v)
}

// kindName says what a value of type t is written as.
func kindName(t reflect.Type) string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "a whole number"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Bool:
		return "true or false"
	case reflect.Slice, reflect.Array:
		if t.Elem().Kind() == reflect.Uint8 {
			return "a base64 string"
		}
		return "a list"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "of type " + t.String()
}

// goTypeName says what a value of the Go type named t is written as.
func goTypeName(t string) string {
	t = strings.TrimLeft(t, "*")
	switch {
	case strings.HasPrefix(t, "int") || strings.HasPrefix(t, "uint"):
		return "a whole number"
	case strings.HasPrefix(t, "float"):
		return "a number"
	case t == "string":
		return "a string"
	case t == "bool":
		return "true or false"
	case strings.HasPrefix(t, "[]"):
		return "a list"
	case strings.HasPrefix(t, "map["):
		return "an object"
	}
	return "of type " + t
}

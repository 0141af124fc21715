// Package config defines the kvindex daemon's configuration and checks it.
//
// A Config is built in Go (Default, or a literal completed by SetDefaults)
// or parsed from YAML (Parse, Load), and checked by Validate, section by
// section; Marshal writes it back as YAML. Nothing here opens sockets.
package config

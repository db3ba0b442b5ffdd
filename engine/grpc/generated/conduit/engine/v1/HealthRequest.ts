// Original file: proto/engine.proto


export interface HealthRequest {
}

export interface HealthRequest__Output {
}
